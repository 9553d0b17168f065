"""The control plane at scale: its real code for N virtual ranks in one process, against a store
that counts requests, keys and bytes (over torch's ``HashStore``) or against a real ``TCPStore``.

Each virtual rank is a :class:`~communicator.control.World` of its own (its ranks on hosts of
``per_host``, no threads or sockets: the simulation beats its watcher and drives its looks and
polling loops on the schedule a real process follows, on a clock of its own that the hosts'
relays read; its process id and probe socket are virtual, see
:mod:`benchmarks.control_virtual`), so what is counted is what N processes would send. The
scenarios are in :mod:`benchmarks.control_scenarios`; news timed against a real server in
:mod:`benchmarks.control_news`; tables and the plot in :mod:`benchmarks.control_report`.
``python -m benchmarks.control_plane`` runs them with a progress line per scenario and size on
stderr, each result streamed (``--json``) as it comes.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import functools
import gc
import itertools
import json
import logging
import os
import resource
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import timedelta
from typing import IO, Any, TypeVar

from torch._C._distributed_c10d import HashStore, PrefixStore, Store, TCPStore

import communicator.control.relay as relay_module
from benchmarks.control_news import News, capacity, time_to_know
from benchmarks.control_virtual import Processes, shared_records
from communicator.config import CommConfig
from communicator.control.log import LOOK_SECONDS
from communicator.control.plane import Control, World
from communicator.control.relay import LOCAL_LOOK_SECONDS, relay_seconds
from communicator.guard import CallState

__all__ = [
    "HOSTS",
    "PER_HOST",
    "SCENARIOS",
    "SIZES",
    "Clock",
    "CountingStore",
    "Result",
    "format_table",
    "main",
    "ranks",
    "run",
    "simulate",
]

T = TypeVar("T")
SIZES = (64, 1024, 10_000)
#: Virtual ranks per host, by default and as the command line runs them all.
PER_HOST = 8
HOSTS = (1, 8, 64)
SCENARIOS = (
    "startup",
    "idle wait",
    "failure",
    "mismatch",
    "stall",
    "lost peer",
    "revoke",
    "refusal",
    "refused everywhere",
    "refusals 10 s apart",
    "cascade",
    "closing",
    "main_process_first",
    "agree",
    "shrink",
)
#: Scenarios that spread news from one rank to every other.
NEWS = ("failure", "mismatch", "lost peer", "revoke")


def _size(value: Any) -> int:
    if isinstance(value, bytes):
        return len(value)
    return len(str(value).encode())


class CountingStore(Store):
    """A store that counts the requests made to it (each call is one request to a real server),
    the keys they name (a ``multi_get`` or ``check`` names every one) and the bytes they carry
    (keys, values written and values returned), and (``timed``) the time spent in them
    (``busy``: the server's part, apart from the virtual ranks' own work, which N processes would
    do side by side)."""

    def __init__(self, inner: Store, timed: bool = False) -> None:
        super().__init__()
        self.inner, self.counts, self.busy, self.timed = inner, Counter[str](), 0.0, timed
        self.keys = self.bytes = 0

    def _request(self, kind: str, keys: int, sent: int, call: Callable[..., T], *args: Any) -> T:
        self.counts[kind] += 1
        self.keys += keys
        if self.timed:
            started = time.perf_counter()
            try:
                found = call(*args)
            finally:
                self.busy += time.perf_counter() - started
        else:
            found = call(*args)
        if isinstance(found, list):
            sent += sum(map(len, found))
        elif isinstance(found, bool):
            sent += 1
        elif found is not None:
            sent += _size(found)
        self.bytes += sent
        return found

    def set(self, key: str, value: Any) -> None:
        self._request("set", 1, len(key) + _size(value), self.inner.set, key, value)

    def get(self, key: str) -> bytes:
        return self._request("get", 1, len(key), self.inner.get, key)

    def add(self, key: str, value: int) -> int:
        return self._request("add", 1, len(key) + 8, self.inner.add, key, value)

    def check(self, keys: list[str]) -> bool:
        return self._request("check", len(keys), sum(map(len, keys)), self.inner.check, keys)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._request("multi_get", len(keys), sum(map(len, keys)), self.inner.multi_get, keys)

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        sent = sum(map(len, keys)) + sum(map(_size, values))
        # every torch store has multi_set; its stubs do not
        self._request("multi_set", len(keys), sent, self.inner.multi_set, keys, values)  # type: ignore[attr-defined]

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        sent = len(key) + _size(expected) + _size(desired)
        return self._request("compare_set", 1, sent, self.inner.compare_set, key, expected, desired)

    def append(self, key: str, value: Any) -> None:
        # every torch store has append; its stubs do not
        self._request("append", 1, len(key) + _size(value), self.inner.append, key, value)  # type: ignore[attr-defined]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def tally(self) -> tuple[int, int, int, float]:
        return self.total, self.keys, self.bytes, self.busy


@dataclasses.dataclass
class Result:
    """One scenario at one size: requests, keys and bytes in all (per rank, per rank per second),
    and how long until every rank knew (:attr:`knows_within`)."""

    scenario: str
    ranks: int
    requests: int
    seconds: float  # the simulated time the scenario covers
    knew: bool  # whether every rank found out what it had to
    served: float | None = None  # the time a real server took for the scenario's requests, one after another
    keys: int = 0
    bytes: int = 0
    per_host: int = PER_HOST
    build_seconds: float = 0.0  # wall time to make the virtual ranks, and to play the scenario
    play_seconds: float = 0.0
    peak_mib: float = 0.0  # peak resident memory: the process's, or with a forked child, both together
    knew_after: float | None = None  # simulated seconds until the last rank knew (news scenarios)
    found_after: float = 0.0  # ... until the first rank knew (0: it posted the news)
    news: float | None = None  # measured: from a post until the last host's read returned it

    @property
    def per_rank(self) -> float:
        return self.requests / self.ranks

    @property
    def keys_per_rank(self) -> float:
        return self.keys / self.ranks

    @property
    def bytes_per_rank(self) -> float:
        return self.bytes / self.ranks

    @property
    def rate(self) -> float:
        return self.per_rank / self.seconds if self.seconds else 0.0

    @property
    def knows_within(self) -> float | None:
        """Seconds until every rank knew: measured against a real store where ``news`` was (the
        first rank's finding, then the hosts' reads under load, then the ranks' next read of their
        host's relay), else as the simulation's schedule had it."""
        if self.news is None or self.knew_after is None:
            return self.knew_after
        return self.found_after + self.news + (LOCAL_LOOK_SECONDS if self.per_host > 1 else 0.0)


def news_delay(per_host: int = PER_HOST) -> float:
    """The longest a record waits to be read, store time aside: a host's relay is read from the
    store once a period, and each rank reads the relay at its next local look."""
    return relay_seconds(per_host) + LOCAL_LOOK_SECONDS if per_host > 1 else LOOK_SECONDS


class Clock:
    """The simulation's wall time: the relays' freshness, the statuses' ages and the judges' terms
    follow it, not the real clock, and it starts at the same second in every run (the judges'
    terms begin at multiples of theirs), so that what a scenario counts is the same however long
    it takes to play."""

    def __init__(self) -> None:
        self.now = 1_000_000_000.0

    def __call__(self) -> float:
        return self.now


@contextlib.contextmanager
def unswept() -> Iterator[None]:
    """Without the sweep of stale relays that a process makes when it opens or closes its own: N
    virtual ranks would each scan the folder of every host's relay (a cost of each real process
    alone, on its own host). The relays and the hosts' status files go to a temporary directory
    of this simulation's own: the virtual worlds' names repeat from run to run, and two
    simulations at once (two test runs) would share their files and count each other's."""
    sweep, tempdir = relay_module._sweep, tempfile.tempdir
    relay_module._sweep, tempfile.tempdir = (lambda where: None), _own_folder()
    try:
        yield
    finally:
        relay_module._sweep, tempfile.tempdir = sweep, tempdir


@functools.cache
def _own_folder() -> str:
    """This process's temporary directory for the virtual hosts' files (removed at its exit): in
    memory (``/dev/shm``) where there is one, since N virtual processes write their statuses and
    read their relays there a few times a second each, and a disk's file system (its renames and
    times journaled) would make that most of the simulation's time."""
    memory = "/dev/shm"
    where = memory if os.path.isdir(memory) and os.access(memory, os.W_OK | os.X_OK) else None
    folder = tempfile.mkdtemp(prefix="communicator-simulation-", dir=where)
    atexit.register(shutil.rmtree, folder, True)
    return folder


@contextlib.contextmanager
def uncollected() -> Iterator[None]:
    """Without the cyclic garbage collector: making N virtual ranks makes millions of objects
    that all live on, and each of the collector's full passes over them (a few while they are
    made) went through all of them: at 10,000 ranks, 6 of the 7 seconds they took."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def ranks(
    store: Store, n: int, stall_seconds: float, clock: Clock, processes: Processes, per_host: int = PER_HOST
) -> list[Control]:
    """``n`` virtual ranks over ``store``, ``per_host`` to a host, their processes in ``processes``
    (installed: see :class:`~benchmarks.control_virtual.Processes`)."""
    config = CommConfig(timeout=timedelta(seconds=600), stall_seconds=stall_seconds)
    controls = []
    with unswept(), uncollected():
        for rank in range(n):
            host = f"h{rank // per_host}"
            with processes.making(rank, host, 1 + rank % per_host):  # its probe: a port of its host's
                world = World(store, rank, n, config, per_host, host=host, threads=False, clock=clock)
            controls.append(Control(world, world.root, rank, CallState(), config))
    return controls


def simulate(
    n: int,
    make_store: Callable[[], Store],
    real: bool = False,
    per_host: int = PER_HOST,
    scenarios: Sequence[str] = SCENARIOS,
    report: Callable[[Result], None] | None = None,
    seconds: float | None = None,
) -> list[Result]:
    """The ``scenarios`` at ``n`` virtual ranks; ``real``: the store is a server, so times are
    reported; ``report``: called with each result as it comes; ``seconds``: how long the waits
    last (the scenarios' own :data:`~benchmarks.control_scenarios.WAIT_SECONDS` when not given)."""
    from benchmarks.control_scenarios import WAIT_SECONDS, forked, scenario  # they use this module's pieces

    results = []
    logging.getLogger("communicator").disabled = True  # virtual ranks' stall warnings are not news
    waits = seconds or WAIT_SECONDS
    try:
        with unswept(), shared_records():
            if real:  # a server's state is not copied with a process: each scenario makes its ranks
                played: Iterable[Result] = (scenario(name, n, make_store, real, per_host, waits) for name in scenarios)
            else:
                played = forked(scenarios, n, make_store, per_host, waits)
            for result in played:
                if real:
                    result.peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                results.append(result)
                if report is not None:
                    report(result)
    finally:
        logging.getLogger("communicator").disabled = False
    return results


def run(
    sizes: Sequence[int] = SIZES,
    real: bool = False,
    hosts: Sequence[int] = (PER_HOST,),
    scenarios: Sequence[str] = SCENARIOS,
    report: Callable[[Result | News], None] | None = None,
) -> list[Result]:
    """The scenarios at every size and host size, against a counting ``HashStore`` or (``real``)
    a ``TCPStore`` server, there with the time news takes to reach every host (reported first)."""
    results = []
    for per_host, n in itertools.product(hosts, sizes):
        if real:
            server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True)
            fresh = itertools.count()

            def scenario_store(server: TCPStore = server, fresh: itertools.count[int] = fresh) -> Store:
                return PrefixStore(f"scenario{next(fresh)}/", server)

            news = time_to_know(n, per_host)
            if report is not None:
                report(news)
            played = simulate(n, scenario_store, True, per_host, scenarios)
            for result in played:
                result.news = news.knew if result.scenario in NEWS else None
                if report is not None:
                    report(result)
            results += played
        else:
            results += simulate(n, HashStore, False, per_host, scenarios, report)
    return results


def format_table(results: Sequence[Result]) -> str:
    lines = [
        "| scenario | ranks a host | N ranks | requests per rank | keys per rank | bytes per rank "
        "| per rank per second | every rank knew | within |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rate = f"{r.rate:.2f}" if r.seconds else ""
        within = "" if r.knows_within is None else f"{r.knows_within:.2f} s"
        lines.append(
            f"| {r.scenario} | {r.per_host} | {r.ranks:,} | {r.per_rank:.2f} | {r.keys_per_rank:.2f} "
            f"| {r.bytes_per_rank:,.0f} | {rate} | {'yes' if r.knew else 'NO'} | {within} |"
        )
    return "\n".join(lines)


def _streamer(out: IO[str] | None) -> Callable[[Result | News], None]:
    """A report of each result: a progress line on stderr, and a JSON line in ``out`` (flushed)."""

    def report(result: Result | News) -> None:
        if isinstance(result, News):
            line = (
                f"news at {result.ranks:,} ranks, {result.per_host} a host: the last of {result.hosts:,} hosts read it"
                f" {result.knew:.3f} s after the post (half {result.median:.3f} s); idle, the hosts asked"
                f" {result.wanted:,.0f} requests/s and made {result.served:,.0f}, {result.late:.3f} s late at most"
            )
            found: dict[str, Any] = {"news": dataclasses.asdict(result)}
        else:
            line = (
                f"{result.scenario} at {result.ranks:,} ranks, {result.per_host} a host:"
                f" {result.per_rank:.2f} requests, {result.keys_per_rank:.2f} keys,"
                f" {result.bytes_per_rank:,.0f} bytes a rank"
                f" ({'knew' if result.knew else 'NOT KNOWN'}; {result.build_seconds:.0f} + {result.play_seconds:.0f} s,"
                f" peak {result.peak_mib:,.0f} MiB)"
            )
            found = {**dataclasses.asdict(result), "knows_within": result.knows_within}
        print(line, file=sys.stderr, flush=True)
        if out is not None:
            out.write(json.dumps(found) + "\n")
            out.flush()

    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.control_plane", description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", nargs="+", type=int, default=list(SIZES), help="virtual ranks")
    parser.add_argument("--hosts", nargs="+", type=int, default=list(HOSTS), help="virtual ranks a host")
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS), metavar="SCENARIO")
    parser.add_argument("--json", metavar="PATH", help="one JSON line per result, written as it comes")
    parser.add_argument("--real-store", action="store_true", help="against a TCPStore server (times reported)")
    parser.add_argument(
        "--store-capacity", action="store_true", help="only: the requests a second one TCPStore serves here"
    )
    parser.add_argument("--news", action="store_true", help="only: news timed against a TCPStore at each size")
    args = parser.parse_args(argv)
    if args.news:
        with contextlib.ExitStack() as stack:
            report = _streamer(stack.enter_context(open(args.json, "w")) if args.json else None)
            for per_host, n in itertools.product(args.hosts, args.ranks):
                report(time_to_know(n, per_host))
        return 0
    if args.store_capacity:
        rates = sorted(capacity() for _ in range(3))
        print(f"one TCPStore served {rates[1]:,.0f} requests/s (of 3 runs: {rates[0]:,.0f} to {rates[2]:,.0f})")
        return 0
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(args.json, "w")) if args.json else None
        results = run(args.ranks, args.real_store, args.hosts, args.scenarios, _streamer(out))
    print(format_table(results))
    return 0 if all(r.knew for r in results) else 1


if __name__ == "__main__":
    # The scenarios import this module by its name: run that one, not a second copy of it as
    # ``__main__`` (its folder for the virtual hosts' files would be another, and a host whose
    # relay's folder was removed, as the last closing rank removes it, could not make it again).
    from benchmarks.control_plane import main as _main

    sys.exit(_main())
