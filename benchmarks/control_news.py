"""How long news takes to reach every host against a real ``TCPStore`` under the load of N ranks,
and how many requests a second one ``TCPStore`` serves on this machine.

Each host's relay reads the store once a period (:func:`~communicator.control.relay.relay_seconds`;
a rank alone on its host reads it itself, once a :data:`~communicator.control.log.LOOK_SECONDS`),
the hosts' reads spread evenly over the period. A few processes drive those reads side by side,
each host's with the control plane's own :class:`~communicator.control.log.EventLog` (what its
look sends: one request when nothing is new, three for a new record) over one connection per
process; the store idles under that load for a while, then one record is posted, and what is
measured is the time from the post until the last host's read returned it. Ranks read their
host's relay within :data:`~communicator.control.relay.LOCAL_LOOK_SECONDS` of that (a file read).
A process that cannot keep up with its hosts' schedule reads late: that lateness is the store's
(and this machine's) limit, and it is in the time measured.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection

from torch._C._distributed_c10d import TCPStore

from communicator.control.log import LOOK_SECONDS, EventLog, StoreHandle
from communicator.control.relay import relay_seconds

__all__ = ["News", "capacity", "time_to_know"]

#: Processes that drive the hosts' reads (the machine has 2 cores: more only share them).
DRIVERS = 4


@dataclasses.dataclass
class News:
    """One measurement: ``hosts`` read the store once per ``period`` each."""

    ranks: int
    per_host: int
    hosts: int
    period: float
    knew: float  # seconds from the post until the last host's read returned it
    median: float  # ... until half the hosts' reads had
    wanted: float  # requests a second the hosts' schedule asks of the store while idle
    served: float  # requests a second they made while idle
    late: float  # how late the latest read ran against its schedule, while idle (seconds)


def _drive(address: tuple[str, int], hosts: Sequence[int], count: int, period: float, pipe: Connection) -> None:
    """Read the store for ``hosts`` (of ``count``) on their schedule from the start it is sent,
    until each read the record posted; send back when each read it, the reads while idle, and
    the latest lateness."""
    client = TCPStore(address[0], address[1], is_master=False, wait_for_workers=False, use_libuv=True)
    logs = [EventLog(StoreHandle(client)) for _ in hosts]
    pipe.send("ready")
    start: float = pipe.recv()
    phases = [period * host / count for host in hosts]
    knew: list[float | None] = [None] * len(hosts)
    idle_reads, late, posted_at = 0, 0.0, float("inf")
    tick = 0
    while any(k is None for k in knew):
        for index, phase in enumerate(phases):
            due = start + tick * period + phase
            now = time.time()
            if due > now:
                time.sleep(due - now)
            elif now < posted_at:
                late = max(late, now - due)
            if knew[index] is not None:
                continue
            if logs[index].look(direct=True):
                knew[index] = time.time()
                posted_at = min(posted_at, float(client.get("posted")))
            elif posted_at == float("inf"):
                idle_reads += 1
        tick += 1
    pipe.send((knew, idle_reads, late))


def time_to_know(ranks: int, per_host: int, idle_seconds: float = 3.0, drivers: int = DRIVERS) -> News:
    """Post one record after ``idle_seconds`` of the hosts' reads of ``ranks`` ranks, ``per_host``
    to a host, against a fresh ``TCPStore`` served by this process (see the module docstring)."""
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True)
    hosts = -(-ranks // per_host)
    period = relay_seconds(per_host) if per_host > 1 else LOOK_SECONDS
    server.add("events", 0)
    context = multiprocessing.get_context("spawn")
    pipes, workers = [], []
    for driver in range(drivers):
        mine, theirs = context.Pipe()
        args = (("127.0.0.1", server.port), range(driver, hosts, drivers), hosts, period, theirs)
        workers.append(context.Process(target=_drive, args=args, daemon=True))
        workers[-1].start()
        pipes.append(mine)
    for pipe in pipes:  # each connected
        pipe.recv()
    start = time.time() + 0.1
    for pipe in pipes:
        pipe.send(start)
    time.sleep(max(start + idle_seconds - time.time(), 0.0))
    posted = time.time()
    server.set("posted", repr(posted))  # before the record: a driver that reads it reads this too
    EventLog(StoreHandle(server)).post({"kind": "revoke", "board": "", "rank": 0})
    knew: list[float] = []
    idle_reads, late = 0, 0.0
    for pipe, worker in zip(pipes, workers, strict=True):
        times, reads, lateness = pipe.recv()
        worker.join()
        knew += [t - posted for t in times]
        idle_reads += reads
        late = max(late, lateness)
    knew.sort()
    return News(
        ranks,
        per_host,
        hosts,
        period,
        knew[-1],
        knew[len(knew) // 2],
        hosts / period,
        idle_reads / (posted - start),
        late,
    )


def _serve(address: tuple[str, int], seconds: float, pipe: Connection) -> None:
    client = TCPStore(address[0], address[1], is_master=False, wait_for_workers=False, use_libuv=True)
    done, until = 0, time.time() + seconds
    while time.time() < until:
        for _ in range(100):
            client.add("events", 0)
        done += 100
    pipe.send(done)


def capacity(clients: int = DRIVERS, seconds: float = 5.0) -> float:
    """Requests a second one ``TCPStore`` (libuv, served by this process) answers to ``clients``
    processes that each send ``add(events, 0)`` (a look when nothing is new) as fast as they can."""
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True)
    context = multiprocessing.get_context("spawn")
    pipes = []
    for _ in range(clients):
        mine, theirs = context.Pipe(duplex=False)
        context.Process(target=_serve, args=(("127.0.0.1", server.port), seconds, theirs), daemon=True).start()
        pipes.append(mine)
    return float(sum(pipe.recv() for pipe in pipes)) / seconds


if __name__ == "__main__":
    print(json.dumps(dataclasses.asdict(time_to_know(1024, 8))))
