"""The control plane at scale: its real code for N virtual ranks in one process, against a store
that counts requests (over torch's ``HashStore``) or against a real ``TCPStore`` server.

Each virtual rank is a :class:`~communicator.control.World` of its own (its ranks on hosts of
:data:`PER_HOST`, no threads or sockets: the simulation beats its watcher and drives its looks on
the schedule a real wait follows, on a clock of its own that the hosts' relays read), so what is
counted is what N processes would send.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from torch._C._distributed_c10d import HashStore, PrefixStore, Store, TCPStore

from communicator.config import CommConfig
from communicator.control.board import backoff
from communicator.control.log import LOOK_SECONDS
from communicator.control.plane import Control, World
from communicator.control.relay import LOCAL_LOOK_SECONDS, relay_seconds
from communicator.control.waiting import FIRST_SLICE_SECONDS
from communicator.errors import CollectiveMismatchError, CommError, PeerLostError, RemoteError
from communicator.guard import CallState

__all__ = ["SCENARIOS", "SIZES", "Clock", "CountingStore", "Result", "format_table", "ranks", "run", "simulate"]

T = TypeVar("T")
SIZES = (64, 1024, 10_000)
#: Virtual ranks per host.
PER_HOST = 8
#: How long the simulated waits last.
WAIT_SECONDS = 10.0
SCENARIOS = (
    "startup",
    "idle wait",
    "failure",
    "mismatch",
    "stall",
    "lost peer",
    "refusal",
    "refused everywhere",
    "closing",
)
#: Scenarios that spread news from one rank to every other.
NEWS = ("failure", "mismatch", "lost peer")


class CountingStore(Store):
    """A store that counts the requests made to it (each call is one request to a real server),
    and the time spent in them (``busy``: the server's part, apart from the virtual ranks' own
    work, which N processes would do side by side)."""

    def __init__(self, inner: Store) -> None:
        super().__init__()
        self.inner, self.counts, self.busy = inner, Counter[str](), 0.0

    def _request(self, kind: str, call: Callable[[], T]) -> T:
        self.counts[kind] += 1
        started = time.perf_counter()
        try:
            return call()
        finally:
            self.busy += time.perf_counter() - started

    def set(self, key: str, value: Any) -> None:
        self._request("set", lambda: self.inner.set(key, value))

    def get(self, key: str) -> bytes:
        return self._request("get", lambda: self.inner.get(key))

    def add(self, key: str, value: int) -> int:
        return self._request("add", lambda: self.inner.add(key, value))

    def check(self, keys: list[str]) -> bool:
        return self._request("check", lambda: self.inner.check(keys))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._request("multi_get", lambda: self.inner.multi_get(keys))

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return self._request("compare_set", lambda: self.inner.compare_set(key, expected, desired))

    def append(self, key: str, value: Any) -> None:
        self._request("append", lambda: self.inner.append(key, value))  # type: ignore[attr-defined]  # every torch store has it

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclasses.dataclass
class Result:
    """One scenario at one size: requests in all, per rank, per rank per second, and how long until
    every rank knew (requests timed against a real server, plus the longest pause between looks)."""

    scenario: str
    ranks: int
    requests: int
    seconds: float  # the simulated time the scenario covers
    knew: bool  # whether every rank found out what it had to
    served: float | None = None  # the time a real server took for the requests that spread the news

    @property
    def per_rank(self) -> float:
        return self.requests / self.ranks

    @property
    def rate(self) -> float:
        return self.per_rank / self.seconds if self.seconds else 0.0

    @property
    def knows_within(self) -> float | None:
        if self.served is None or self.scenario not in (*NEWS, "startup"):
            return None
        return self.served + (news_delay() if self.scenario in NEWS else 0.0)


def news_delay() -> float:
    """The longest a record waits to be read, store time aside: a host's relay is read from the
    store once a period, and each rank reads the relay at its next local look."""
    return relay_seconds(PER_HOST) + LOCAL_LOOK_SECONDS if PER_HOST > 1 else LOOK_SECONDS


class Clock:
    """The simulation's time: the relays' freshness is judged by it, not by the wall clock."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def looks_within(seconds: float, cap: float) -> list[float]:
    """When a wait of ``seconds`` looks at its board, its pauses at most ``cap`` (see
    :func:`communicator.control.waiting.wait`)."""
    pause, now, times = backoff(FIRST_SLICE_SECONDS, cap), FIRST_SLICE_SECONDS, []
    while (now := now + pause()) <= seconds:
        times.append(now)
    return times


def ranks(store: Store, n: int, stall_seconds: float, clock: Clock) -> list[Control]:
    """``n`` virtual ranks over ``store``, :data:`PER_HOST` to a host."""
    config = CommConfig(timeout=timedelta(seconds=600), stall_seconds=stall_seconds)
    controls = []
    for rank in range(n):
        world = World(store, rank, n, config, PER_HOST, host=f"h{rank // PER_HOST}", threads=False, clock=clock)
        controls.append(Control(world, world.root, rank, CallState(), config))
    return controls


def _wait(controls: Sequence[Control], seconds: float, clock: Clock) -> bool:
    """Every rank waits ``seconds`` in the same operation, looking on the real schedule, its
    watcher beating once a second; whether a verdict reached every rank."""
    started, wall = time.monotonic(), clock.now
    stalls = [c.watch.begin(c.rank, "all_reduce", started, 600.0) for c in controls]
    beat = 0.0
    for at in looks_within(seconds, controls[0].board.log.look_seconds):
        clock.now = wall + at
        while beat + 1.0 <= at:
            beat += 1.0
            for control in controls:
                control.world.watcher.beat(started + beat)
        for control, stall in zip(controls, stalls, strict=True):
            control.board.check(control.rank, 0, "all_reduce")
            stall.tick(started + at)
    return all(stall.verdict is not None for stall in stalls)


def _refuse(refusing: Sequence[Control], controls: Sequence[Control], clock: Clock) -> bool:
    """Collective #1 refused by ``refusing``, started by the others: each of those finds out at its
    next look and says it left; then each refusing rank settles, going on only if every rank
    refused. Whether each did what it should."""
    for control in controls:
        control._calls.seq = 1
    for control in refusing:
        control.bad_arguments(ValueError("unknown reduce op"), "all_reduce", collective=True)
    clock.now += news_delay()
    refused = {id(c) for c in refusing}
    others = [c for c in controls if id(c) not in refused]
    knew = _spread([refusing[0], *others], lambda: None, RemoteError, clock)
    clock.now += news_delay()
    for control in refusing:
        try:
            control.settle()
            knew = knew and not others
        except CommError:
            knew = knew and bool(others)
    return knew


def _spread(controls: Sequence[Control], post: Callable[[], None], error: type[CommError], clock: Clock) -> bool:
    """``post`` on one rank, then every other rank's next look, once the hosts' relays are due to
    read the store again; whether each raised ``error``."""
    clock.now += news_delay()
    post()
    knew = True
    for control in controls[1:]:
        try:
            control.board.check(control.rank, 1, "all_reduce")
            knew = False
        except error:
            pass
    return knew


def simulate(n: int, make_store: Callable[[], Store], real: bool = False) -> list[Result]:
    """Every scenario at ``n`` virtual ranks; ``real``: the store is a server, so times are reported."""
    results = []
    logging.getLogger("communicator").disabled = True  # virtual ranks' stall warnings are not news
    try:
        for scenario in SCENARIOS:
            results.append(_scenario(scenario, n, make_store, real))
    finally:
        logging.getLogger("communicator").disabled = False
    return results


def _scenario(scenario: str, n: int, make_store: Callable[[], Store], real: bool) -> Result:
    counting, clock = CountingStore(make_store()), Clock()
    stall_seconds = 4.0 if scenario == "stall" else 600.0
    controls = ranks(counting, n, stall_seconds, clock)
    try:
        return _play(scenario, controls, counting, clock, real)
    finally:
        for control in controls:
            if control.world.relay is not None:
                control.world.relay.remove()


def _play(scenario: str, controls: Sequence[Control], counting: CountingStore, clock: Clock, real: bool) -> Result:
    n, first = len(controls), controls[0]
    for control in controls:  # the first look
        control.board.check(control.rank, 0, "startup")
    before, busy, seconds, knew = counting.total, counting.busy, 0.0, True
    if scenario == "startup":
        before, busy = 0, 0.0
    elif scenario in ("idle wait", "stall"):
        seconds = WAIT_SECONDS
        knew = _wait(controls, WAIT_SECONDS, clock) or scenario == "idle wait"
    elif scenario == "failure":
        knew = _spread(controls, lambda: first.failed(RuntimeError("boom"), "step"), RemoteError, clock)
    elif scenario == "mismatch":
        error = CollectiveMismatchError({0: "in all_reduce #1", 1: "in broadcast #1"}, "different collectives")
        knew = _spread(controls, lambda: first.board.post_mismatch(0, error), CollectiveMismatchError, clock)
    elif scenario == "lost peer":
        lost = lambda: first.board.post_lost(0, n - 1, "its process has exited")  # noqa: E731 - as the judge posts it
        knew = _spread(controls[:-1], lost, PeerLostError, clock)
    elif scenario in ("refusal", "refused everywhere"):
        knew = _refuse(controls if scenario == "refused everywhere" else controls[:1], controls, clock)
    else:  # closing: every rank leaves
        for control in controls:
            control.close(None)
    served = counting.busy - busy if real else None
    return Result(scenario, n, counting.total - before, seconds, knew, served)


def run(sizes: Sequence[int] = SIZES, real: bool = False) -> list[Result]:
    """Every scenario at every size, against a counting ``HashStore`` or (``real``) a ``TCPStore`` server."""
    results = []
    for n in sizes:
        if real:
            server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True)
            fresh = itertools.count()

            def scenario_store(server: TCPStore = server, fresh: itertools.count[int] = fresh) -> Store:
                return PrefixStore(f"scenario{next(fresh)}/", server)

            results += simulate(n, scenario_store, real=True)
        else:
            results += simulate(n, HashStore)
    return results


def format_table(results: Sequence[Result]) -> str:
    lines = [
        "| scenario | N ranks | store requests | per rank | per rank per second | every rank knew | within |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rate = f"{r.rate:.2f}" if r.seconds else ""
        within = "" if r.knows_within is None else f"{r.knows_within:.2f} s"
        lines.append(
            f"| {r.scenario} | {r.ranks:,} | {r.requests:,} | {r.per_rank:.1f} | {rate} "
            f"| {'yes' if r.knew else 'NO'} | {within} |"
        )
    return "\n".join(lines)


def plot(results: Sequence[Result], path: str) -> None:
    """Store requests against ranks, per scenario, on log-log axes (needs matplotlib); the dotted
    line is what startup cost before this design (2N², every rank reading every peer's keys)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for scenario in SCENARIOS:
        points = sorted((r.ranks, r.requests) for r in results if r.scenario == scenario and r.served is None)
        if points:
            axes.plot(*zip(*points, strict=True), marker="o", label=scenario)
    sizes = sorted({r.ranks for r in results})
    axes.plot(sizes, [2 * n * n for n in sizes], linestyle=":", color="grey", label="startup before (2N²)")
    axes.set(xscale="log", yscale="log", xlabel="ranks", ylabel="store requests, all ranks together")
    axes.set_title("The control plane's store requests grow linearly with the job")
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
