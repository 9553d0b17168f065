"""The control plane's cost at scale, from operation counts alone: its real code for virtual ranks
against a store that counts requests, keys and bytes (no timing, so it holds on any machine)."""

from __future__ import annotations

import functools
import os
import tempfile
import time

import pytest
from torch._C._distributed_c10d import HashStore

import communicator.control.relay as relay
from benchmarks.control_plane import SCENARIOS, Clock, CountingStore, Result, news_delay, ranks, simulate, unswept
from benchmarks.control_scenarios import WAVES, _waves
from benchmarks.control_virtual import Processes, shared_records, timed_by
from communicator.control.plane import Control

# Thousands of virtual ranks in one process: minutes on a loaded 2-core machine
pytestmark = pytest.mark.timeout(1200)
# Linear in all, flat per rank: 16 times the ranks may cost at most 16 x 1.25 times as much.
GROWTH = 16 * 1.25
#: What a CI machine runs at 10,000 ranks within about a minute: every scenario where each rank
#: posts (the ones whose readers once read N records each), and the news of one.
AT_TEN_THOUSAND = ("failure", "refused everywhere", "closing")
#: The scenarios in which ranks wait (for the simulated seconds, or arriving over them).
WAITS = ("idle wait", "stall", "refusals 10 s apart", "main_process_first")
#: The survivors' protocols.
SURVIVORS = ("agree", "shrink")
#: The two sizes every scenario is compared at, 16 times apart.
SIZES = (64, 1024)


@functools.cache
def _simulated() -> dict[int, dict[str, Result]]:
    """Every scenario at both sizes, once per process: a module-scoped fixture is made again
    whenever a worker runs another file's test between this file's."""
    return {n: {r.scenario: r for r in simulate(n, HashStore)} for n in SIZES}


@pytest.fixture
def counts() -> dict[int, dict[str, Result]]:
    return _simulated()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_requests_keys_and_bytes_grow_linearly_and_stay_flat_per_rank(counts, scenario: str) -> None:
    small, large = (counts[n][scenario] for n in SIZES)
    assert small.knew and large.knew  # every rank found out what it had to
    for measure in ("requests", "keys", "bytes"):
        assert getattr(large, measure) <= getattr(small, measure) * GROWTH, measure
    assert large.per_rank <= small.per_rank * 1.25
    assert large.rate <= small.rate * 1.25


@pytest.mark.parametrize("n", SIZES)
def test_the_survivors_of_a_lost_rank_agree_and_shrink_to_themselves(counts, n: int) -> None:
    assert all(counts[n][scenario].knew for scenario in SURVIVORS)


def test_news_costs_a_few_requests_and_bytes_per_rank(counts) -> None:
    for scenario in ("failure", "mismatch", "lost peer", "revoke", "refusal", "refused everywhere", "closing"):
        assert counts[1024][scenario].per_rank <= 5, scenario
        assert counts[1024][scenario].bytes_per_rank <= 500, scenario  # a few records per host, not N per rank
    # every rank failing on its own and leaving: its own post and closing, and a few records a host
    assert counts[1024]["cascade"].per_rank <= 8
    assert counts[1024]["cascade"].bytes_per_rank <= 2_000
    # where it runs (two), its first status, the world's name, and its host's first look shared
    assert counts[1024]["startup"].per_rank <= 6
    # a long wait looks about once a second, whatever the size of the job
    assert counts[1024]["idle wait"].rate <= 2.0


@pytest.mark.parametrize(("per_host", "most"), [(1, 1.5), (8, 0.33)])
def test_a_wait_makes_a_few_requests_at_its_start_then_about_one_a_second(per_host: int, most: float) -> None:
    # Each wait played 10 and 30 simulated seconds long: per rank, what it costs for each second it
    # lasts and at its start. A rank alone on its host: a look a second, a stall judge's election
    # each 5 s term, its heartbeat each 5 s. Where a relay serves, all of it is the host's: two
    # looks a second, one candidate an election, one heartbeat for its processes (2.4 a second a
    # host), and the one judge's read of the statuses, once a second in the job. At its start, a
    # barrier or a settling rank reads its counters itself (five looks in 1.5 s) before the relay.
    short, long = (_waits(per_host, seconds) for seconds in (10.0, 30.0))
    for scenario in WAITS:
        per_second = (long[scenario].per_rank - short[scenario].per_rank) / 20
        at_start = short[scenario].per_rank - 10 * per_second
        assert per_second <= most and at_start <= 10, (scenario, per_second, at_start)


def _waits(per_host: int, seconds: float) -> dict[str, Result]:
    return {r.scenario: r for r in simulate(64, HashStore, per_host=per_host, scenarios=WAITS, seconds=seconds)}


@pytest.mark.timeout(600)  # about a minute alone on 2 cores
def test_ten_thousand_ranks_cost_what_a_thousand_do_per_rank(counts) -> None:
    large = {r.scenario: r for r in simulate(10_000, HashStore, scenarios=AT_TEN_THOUSAND)}
    for scenario in AT_TEN_THOUSAND:
        small = counts[1024][scenario]
        assert large[scenario].knew, scenario
        assert large[scenario].per_rank <= small.per_rank * 1.25, scenario
        assert large[scenario].keys_per_rank <= small.keys_per_rank * 1.25, scenario
        assert large[scenario].bytes_per_rank <= small.bytes_per_rank * 1.25, scenario


def test_what_a_scenario_counts_follows_the_simulated_clock_alone(counts, monkeypatch: pytest.MonkeyPatch) -> None:
    # A loaded machine plays the scenarios slowly: here the wall clock runs 100 times as fast as
    # the simulation, and nothing counted may change (from what every scenario counted at 64 ranks).
    played = counts[64]
    real, start = time.time, time.time()
    monkeypatch.setattr(time, "time", lambda: start + (real() - start) * 100)
    for again in simulate(64, HashStore):
        first = played[again.scenario]
        assert (again.requests, again.keys, again.bytes) == (first.requests, first.keys, first.bytes), again.scenario


def test_ranks_lingering_on_closing_after_a_mismatch_read_their_host_s_relay() -> None:
    # Every rank raised a mismatch, so each lingers as it closes (in ten waves) until the others
    # closed: its first looks read the closings' count, then the log through its host's relay,
    # where the last rank to close says so. Reading the count about once a second each, as they
    # did, the lingering cost 6.9 requests a rank here; the last ones stopped 0.9 s after the last
    # closing.
    without, _ = _closed_in_waves(lingering=False)
    with_lingering, stopped = _closed_in_waves(lingering=True)
    assert with_lingering - without <= 4.5
    assert stopped <= (WAVES - 1) * news_delay(8) + news_delay(8)  # once the last closing was relayed


def _closed_in_waves(lingering: bool) -> tuple[float, float]:
    """64 ranks, 8 a host, close in waves (lingering as after a mismatch, or not): the requests a
    rank, and when the last closing ended (simulated seconds)."""
    counting, clock, processes = CountingStore(HashStore()), Clock(), Processes()
    with unswept(), shared_records(), processes.installed(), timed_by(clock):
        controls = ranks(counting, 64, 600.0, clock, processes)
        for control in controls:
            control.world.watcher._written = ("", clock.now)
            control.board.check(control.rank, 0, "startup")
            control.board._mismatch_raised, control._calls.seq = lingering, 1
        before, started = counting.total, clock.now
        closed, leaving = _waves(controls, lambda c: c.closing(None, clock.now), 1, clock)
        assert closed and len(leaving.ended) == len(controls)
        return (counting.total - before) / len(controls), max(leaving.ended.values()) - started


def test_a_judge_serves_while_it_waits_and_is_replaced_once_it_stops() -> None:
    wall, processes = Clock(), Processes()  # the terms follow the wall clock, which every process shares
    with processes.installed():
        _judges_take_over(wall, ranks(HashStore(), 4, 600.0, wall, processes))


def _judges_take_over(wall: Clock, controls: list[Control]) -> None:
    started, begun = 0.0, wall.now
    waits = [c.watch.begin(c.rank, "all_reduce", started, 600.0) for c in controls]

    def beat(at: float, ticking: list[int]) -> list[int]:
        wall.now = begun + at
        for rank in ticking:
            waits[rank].tick(started + at)
        return [rank for rank in ticking if waits[rank].judging]

    first = [beat(float(at), [0, 1, 2, 3]) for at in range(2, 14)]
    assert all(judges == first[0] and len(judges) == 1 for judges in first)  # one judge, term after term
    others = [r for r in range(4) if r != first[0][0]]
    later = [beat(float(at), others) for at in range(14, 24)]
    assert len(later[-1]) == 1 and later[-1][0] in others  # the judge stopped waiting: another took over


def test_relays_left_by_killed_processes_are_removed_after_a_day(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(relay, "_swept", False)
    folder = tmp_path / f"communicator-{os.getuid()}"
    folder.mkdir(mode=0o700)
    old, recent = folder / "old-h0.relay", folder / "recent-h0.relay"
    for path in (old, recent):
        path.write_bytes(b"1 {}\n")
    day_ago = time.time() - relay.STALE_SECONDS - 60
    os.utime(old, (day_ago, day_ago))
    made = relay.Relay.open("new", "h0", 4)
    assert made is not None and made.path.parent == folder
    assert not old.exists() and recent.exists()


def test_a_relay_made_again_after_its_removal_is_read_from_its_start(tmp_path) -> None:
    # The new file may get the old one's inode: its first line tells it apart.
    path = tmp_path / "w-h0.relay"
    first, second = relay.Relay(path, 0.25), relay.Relay(path, 0.25)
    with first.turn() as turn:
        turn.hand([(1, b'{"kind": "closed"}')])
    assert second.read() == [(1, b'{"kind": "closed"}')] and first.read() == []
    first.remove()
    with second.turn() as turn:  # due: nobody read the store for the new file
        turn.hand([(2, b'{"kind": "fail", "board": "", "rank": 0}')])
    assert first.read() == [(2, b'{"kind": "fail", "board": "", "rank": 0}')]
