"""The control plane of one communicator: its board, its stall watch and its waits, over the
store of its world (see :mod:`communicator.control`)."""

from __future__ import annotations

import hashlib
import os
import re
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from communicator.config import CommConfig
from communicator.control.barrier import barrier_poll
from communicator.control.board import FailureBoard
from communicator.control.liveness import Hosts
from communicator.control.log import RANK_ZERO, EventLog, Store, StoreHandle, guarded_store
from communicator.control.neighbours import Neighbours
from communicator.control.polls import DIRECT_SECONDS, Pacer, Poll, drive
from communicator.control.records import Seal
from communicator.control.relay import Relay
from communicator.control.stalls import Watch, Watcher
from communicator.control.survivors import Survivors
from communicator.control.waiting import TransferWaiter, translate, wait
from communicator.errors import CollectiveMismatchError, CommError, CommTimeoutError, RemoteFailure
from communicator.guard import CallState
from communicator.launchers.network import GLOO_IFNAME, interface_addresses, is_loopback, route_source
from communicator.observe.events import DONE

__all__ = ["PROBE_ADDRESS", "Control", "World"]

#: The address other hosts reach this process's probe socket at, when the host name is not it.
PROBE_ADDRESS = "COMMUNICATOR_PROBE_ADDRESS"


class World:
    """What the communicators of one world share in a process: the store, the event log, where
    the ranks run, and the watcher thread that publishes this process's status."""

    def __init__(
        self,
        store: Store,
        world_rank: int,
        world_size: int,
        config: CommConfig,
        local_size: int,
        address: str = "",
        host: str = "",
        threads: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        # host, threads=False and clock: a virtual rank of the simulation (benchmarks.control_plane)
        self.store = StoreHandle(store, store_place(config))
        self.world_rank, self.world_size, self.local_size = world_rank, world_size, local_size
        self.seal = Seal()
        name = self._name() if local_size > 1 or self.seal.signing else ""
        self.seal.scope = name
        self.hosts = Hosts(self.store, host=host, address=address, seal=self.seal)
        self.relay = Relay.open(name, self.hosts.host, local_size, clock) if local_size > 1 else None
        self.log = EventLog(self.store, self.relay, clock, self.seal)
        self.hosts.announce(world_rank, listen=threads)
        self.root = FailureBoard(self.log, self.hosts, self.store, "", range(world_size), local_size)
        self.neighbours = Neighbours(self.relay, clock) if self.relay is not None else None
        self.watcher = Watcher(
            self.root,
            self.hosts,
            world_rank,
            world_size,
            config.stall_seconds,
            threads,
            clock,
            self.neighbours,
            local_size,
        )
        self.users = 0  # open communicators of this world
        self.clock = clock  # wall time, which every process shares (the judges' terms follow it)

    def _name(self) -> str:
        """A name for this world that its processes share (one request: the first to ask names it),
        32 hex digits (a name someone else wrote is hashed into one: it names a file)."""
        mine = uuid.uuid4().hex
        name = guarded_store(lambda: self.store.compare_set("name", "", mine))
        if re.fullmatch(rb"[0-9a-f]{32}", name):
            return name.decode()
        return hashlib.sha256(name).hexdigest()[:32]

    def stop(self) -> None:
        self.watcher.stop()
        self.hosts.close()
        if self.neighbours is not None:
            self.neighbours.forget(self.world_rank)
        if self.relay is not None:
            self.relay.close()


class Control:
    """One communicator's board, watch and transfer thread; ``rank`` is the communicator's own."""

    def __init__(self, world: World, board: FailureBoard, rank: int, calls: CallState, config: CommConfig) -> None:
        self.world, self.board, self.rank, self._calls = world, board, rank, calls
        self.limit = config.timeout.total_seconds()
        self.watch = Watch(world.watcher, board, calls, config.stall_seconds, world.clock)
        self.transfers = TransferWaiter()
        self.broken: CommError | None = None
        self.survivors = Survivors(board, rank)
        self.refused: tuple[int, RemoteFailure] | None = None  # the last collective this rank refused, and why
        world.users += 1

    @classmethod
    def for_world(
        cls, store: Store, rank: int, world_size: int, calls: CallState, config: CommConfig, local_size: int = 1
    ) -> Control:
        """The control of a world communicator over ``store`` (its ranks are the world's)."""
        world = World(store, rank, world_size, config, local_size, probe_address())
        return cls(world, world.root, rank, calls, config)

    def child(self, members: Sequence[int], name: str, rank: int, calls: CallState, config: CommConfig) -> Control:
        """The control of a subgroup over world ranks ``members`` (``rank`` is this rank's in it)."""
        return Control(self.world, self.board.child(members, name), rank, calls, config)

    # -- what the base class asks ----------------------------------------------------------

    def wait(self, works: Sequence[Any], timeout: float | None) -> None:
        calls, event = self._calls, self._calls.event
        collective = event is not None and not event.p2p
        try:
            limit = timeout or self.limit
            wait(works, self.board, self.transfers, self.rank, calls.seq, calls.op, limit, self.watch, collective)
        except CommError as error:
            raise self.abandon(error) from error.__cause__  # the transport's own error, where it had one

    def abandon(self, error: CommError) -> CommError:
        """This rank leaves an operation unfinished: the group can no longer be trusted, and the
        other ranks must hear of it (they may be waiting in the same operation)."""
        if self.broken is None:
            self.broken = error
            if isinstance(error, CollectiveMismatchError) and not self.board.knows_mismatch():
                self.board.post_mismatch(self.rank, error)
            self.board.post(RemoteFailure.of(self.rank, error, self._calls.op), self.completed())
        return error

    def completed(self) -> int:
        """The collectives this rank has completed: those it entered, less the last one if it is
        still running or ended with an error (its peers may still be waiting in it)."""
        calls = self._calls
        last = next((e for e in reversed(calls.recorder.events()) if not e.p2p), None)
        if last is None or last.seq != calls.seq:  # none yet, or out of the recorder: as entered
            return calls.seq
        return calls.seq if last.state == DONE else calls.seq - 1

    def launch_failed(self, error: RuntimeError) -> CommError:
        found = translate(error, self.board, self.rank, self._calls.seq, self._calls.op)
        if found is not error and found.__cause__ is None:
            found.__cause__ = error  # the transport's own words stay with it
        return self.abandon(found)

    def bad_arguments(self, error: BaseException, what: str, collective: bool) -> None:
        refusal = RemoteFailure.of(self.rank, error, what)
        self.board.post_input(self._calls.seq, refusal, collective)
        if collective:
            self.refused = self._calls.seq, refusal

    def settle(self) -> None:
        """Before this rank communicates again after refusing its arguments to a collective, which
        the others may have started without it: wait until every rank refused it too (the group
        is intact), or leave the communicator unusable as soon as one rank started it instead
        (this rank's next data would meet that operation there). One request a poll (counters,
        backing off to one a second), and the log read for failures and closings as often as a
        waiting rank reads it, when its count moved; all of it about one request a second once the
        wait lasts (see :class:`~communicator.control.polls.Pacer`)."""
        drive(self.settling(time.monotonic()))

    def settling(self, now: float) -> Poll[None]:
        """:meth:`settle` as a poll (see :mod:`communicator.control.polls`)."""
        assert self.refused is not None
        (seq, refusal), calls, every = self.refused, self._calls, self.world.log.look_seconds
        started = looked = now
        pause = Pacer(self.world.store, now=now)
        try:
            while True:
                look = now - looked >= every
                looked = now if look else looked
                relayed = self.world.relay is not None and now - started >= DIRECT_SECONDS  # past its first looks
                if self.board.refused_by_all(self.rank, seq, calls.op, look, relayed):
                    return
                if now - started > self.limit:
                    raise CommTimeoutError(
                        f"{calls.op} on rank {self.rank}: after {self.limit:g} s, not every rank has refused "
                        f"operation #{seq} (as this rank did) or left it"
                    )
                now = yield every if relayed else pause(now)  # the relay's reads are the host's, paced there
        except CommError as error:
            if self.broken is None:  # unusable now; a rank released later names the refusal as the cause
                self.broken = error
                self.board.post(refusal, self.completed())
            raise error from None

    def failed(self, error: BaseException, where: str) -> None:
        self.board.post(RemoteFailure.of(self.rank, error, where), self.completed())
        if self.broken is None:
            self.broken = CommError(f"rank {self.rank} failed in {where}")

    def barrier(self, timeout: float) -> None:
        """Through the store, not the transport: a rank that times out leaves the group intact,
        and every waiting rank names the late ones itself."""
        drive(self.barrier_poll(timeout, time.monotonic()))

    def barrier_poll(self, timeout: float, now: float) -> Poll[None]:
        """:meth:`barrier` as a poll (see :mod:`communicator.control.polls`)."""
        calls = self._calls
        stall = self.watch.begin(self.rank, calls.op, now, timeout)
        return barrier_poll(self.board, self.rank, calls.seq, timeout, calls.op, stall.tick, stall.who, now)

    def close(self, error: BaseException | None) -> None:
        """Tell the others this rank left (and why, after ``error``); no collective. Never raises."""
        drive(self.closing(error, time.monotonic()))

    def closing(self, error: BaseException | None, now: float) -> Poll[None]:
        """:meth:`close` as a poll from ``now`` (see :mod:`communicator.control.polls`): it waits
        only where it lingers (see :meth:`~communicator.control.board.FailureBoard.lingering`)."""
        try:
            if error is not None:
                self.board.post(RemoteFailure.of(self.rank, error, "the communicator's block"), self.completed())
            refused = self.refused[0] if self.refused is not None else -1
            self.board.post_closed(self.rank, self._calls.seq, self._calls.op, refused)
            yield from self.board.lingering(now)
        finally:
            self.transfers.stop()
            self.world.watcher.forget(self.board.name)
            self.world.users -= 1
            if self.world.users == 0:
                self.world.stop()

    def release(self) -> None:
        """Nothing is posted or read after this; the last communicator of the world lets go of its store."""
        self.board.release()
        if self.world.users == 0:
            self.world.store.release()


def store_place(config: CommConfig) -> str:
    """Where the store of a world that ``config`` made runs, as an error about it says."""
    if config.store is not None and config.init_method is None:
        return f"served at {config.store}, outside the ranks"
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return "served by torchrun's agent"
    return RANK_ZERO


def probe_address() -> str:
    """Where other hosts reach this process: :data:`PROBE_ADDRESS`, else the address that routes
    to torch's ``MASTER_ADDR``, else the host name. On the master's own host that route is often
    loopback (its name resolves to 127.0.1.1 on Debian): then the address of the interface gloo
    uses (``GLOO_SOCKET_IFNAME``), which the other hosts reach."""
    given = os.environ.get(PROBE_ADDRESS, "")
    master = os.environ.get("MASTER_ADDR", "")
    if given or not master:
        return given
    try:
        source = route_source(master)
    except CommError:
        return ""
    interface = os.environ.get(GLOO_IFNAME, "")
    if is_loopback(source) and interface:
        reachable = [a for a in interface_addresses().get(interface, []) if not is_loopback(a) and "%" not in a]
        return reachable[0] if reachable else source
    return source
