"""Statistics, hooks, profiler ranges and the flight recorder, on NonDistComm and real gloo ranks."""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

import pytest
import torch

from communicator import CollectiveMismatchError, CommError, Communicator, RemoteError
from communicator.guard import CallState
from communicator.observe.events import Event
from communicator.observe.stats import Statistics

pytestmark = pytest.mark.world_size(1, 2, 3, 4)

F32, F64, I64 = 4, 8, 8  # bytes per element
DICTS = 3 * F32 + I64 + 4000 * F32  # the values of the two all_reduce_dict calls


def known_sequence(comm: Communicator) -> dict[str, dict[str, Any]]:
    """A fixed sequence of tensor operations; every rank returns its statistics rows."""
    world, rank = comm.world_size, comm.rank
    for _ in range(3):
        comm.all_reduce(torch.ones(10))
    comm.broadcast(torch.ones(4, dtype=torch.float64), src=world - 1)
    comm.reduce(torch.ones(5), dst=0)
    comm.all_gather(torch.ones(rank + 1, dtype=torch.int64))  # uneven: rank r sends r+1 elements
    comm.gather(torch.ones(2 * (rank + 1)), dst=world - 1)
    comm.scatter([torch.ones(3) for _ in range(world)] if rank == 0 else None, src=0)
    comm.reduce_scatter([torch.ones(6) for _ in range(world)])
    comm.all_to_all([torch.ones(7, dtype=torch.float64) for _ in range(world)])
    comm.all_reduce_dict({"loss": torch.ones(3), "n": 2})  # small: the values travel in the keys' record
    comm.all_reduce_dict({"big": torch.ones(4000)})  # large: one all_reduce of the values
    if world > 1 and rank in (0, 1):
        if rank == 0:
            comm.send(torch.ones(9), dst=1)
        else:
            comm.recv(torch.empty(9), src=0)
    comm.barrier()
    return {row["op"]: row for row in comm.stats().as_dict()}


def expected_rows(rank: int, world: int) -> dict[str, tuple[int, int, int, int]]:
    """(calls, sent, received, size) of each operation of ``known_sequence`` on ``rank``."""
    moves = world > 1
    gathered = sum(range(1, world + 1))
    rows = {
        "all_reduce": (3, 3 * 10 * F32, 3 * 10 * F32, 3 * 10 * F32),
        "broadcast": (1, 4 * F64 if rank == world - 1 else 0, 0 if rank == world - 1 else 4 * F64, 4 * F64),
        "reduce": (1, 0 if rank == 0 else 5 * F32, 5 * F32 if rank == 0 else 0, 5 * F32),
        "all_gather": (1, (rank + 1) * I64, (gathered - rank - 1) * I64, gathered * I64),
        "gather": (  # off the destination only its own part is known: that times the world size
            1,
            0 if rank == world - 1 else 2 * (rank + 1) * F32,
            2 * (gathered - world) * F32 if rank == world - 1 else 0,
            2 * gathered * F32 if rank == world - 1 else 2 * (rank + 1) * F32 * world,
        ),
        "scatter": (1, 3 * F32 * (world - 1) if rank == 0 else 0, 0 if rank == 0 else 3 * F32, 3 * F32 * world),
        "reduce_scatter": (1, 6 * F32 * (world - 1), 6 * F32, 6 * F32 * world),
        "all_to_all": (1, 7 * F64 * (world - 1), 7 * F64 * (world - 1), 7 * F64 * world),
        "all_reduce_dict": (2, DICTS, DICTS, DICTS),
        "barrier": (1, 0, 0, 0),
    }
    if not moves:  # in a world of one nothing is sent or received
        rows = {op: (calls, 0, 0, size) for op, (calls, _, _, size) in rows.items()}
    if world > 1 and rank == 0:
        rows["send"] = (1, 9 * F32, 0, 9 * F32)
    if world > 1 and rank == 1:
        rows["recv"] = (1, 0, 9 * F32, 9 * F32)
    return rows


def test_statistics_of_a_known_sequence_are_exact_on_every_rank(run, world_size: int) -> None:
    for rank, rows in enumerate(run(known_sequence, cfg={"stats": True, "launcher": "auto"})):
        expected = expected_rows(rank, world_size)
        assert set(rows) == set(expected), (rank, set(rows) ^ set(expected))
        for op, (calls, sent, received, size) in expected.items():
            row = rows[op]
            got = (row["calls"], row["sent"], row["received"], row["size"])
            assert got == (calls, sent, received, size), (rank, op, got)
            assert row["errors"] == 0 and row["time"] >= row["wait"] >= 0
            if op == "barrier":
                assert row["algbw"] is None
            elif size:
                assert row["algbw"] > 0 and row["busbw"] >= 0


def statistics_off(comm: Communicator) -> tuple[int, int]:
    comm.all_reduce(torch.ones(3))
    with comm.profile() as profile:
        comm.all_reduce(torch.ones(3))
        comm.broadcast_object("x")
    comm.all_reduce(torch.ones(3))
    return len(comm.stats().rows), profile.stats["all_reduce"].calls + profile.stats["broadcast_object"].calls


def test_statistics_are_off_by_default_and_profile_scopes_a_block(run, world_size: int) -> None:
    assert run(statistics_off) == [(0, 2)] * world_size


def objects_separate_encoding(comm: Communicator) -> dict[str, dict[str, Any]]:
    payload = {"weights": list(range(5000)), "name": "x" * 3000}
    comm.broadcast_object(payload if comm.rank == 0 else None, src=0)
    comm.all_gather_object([comm.rank] * 2000)
    return {row["op"]: row for row in comm.stats().as_dict()}


def test_object_statistics_separate_serialisation_from_transfer(run, world_size: int) -> None:
    rows = run(objects_separate_encoding, cfg={"stats": True, "launcher": "auto"})
    root = rows[0]["broadcast_object"]
    if world_size == 1:  # one process passes objects through: nothing is encoded
        assert root["serialize"] == root["sent"] == rows[0]["all_gather_object"]["serialize"] == 0
        return
    assert root["serialize"] > 0 and root["deserialize"] == 0 and root["received"] == 0
    assert root["sent"] > 5000  # the encoded object's bytes
    for rank, mine in enumerate(rows):
        gathered = mine["all_gather_object"]
        assert gathered["serialize"] > 0 and gathered["sent"] > 2000
        assert gathered["algbw"] is None  # objects have no bandwidth
        if rank:
            row = mine["broadcast_object"]
            assert row["serialize"] == 0 and row["deserialize"] > 0
            assert row["received"] == root["sent"]  # what the root encoded is what each rank decoded
            assert gathered["deserialize"] > 0 and gathered["received"] > 0
        else:
            others = [rows[r]["all_gather_object"]["sent"] for r in range(1, world_size)]
            assert gathered["received"] == sum(others)


def hooks_see_every_call(comm: Communicator) -> list[tuple[str, str, int, str]]:
    seen: list[tuple[str, str, int, str]] = []
    handle = comm.add_hook(
        pre=lambda e: seen.append(("pre", e.op, e.seq, e.state)),
        post=lambda e: seen.append(("post", e.op, e.seq, e.state)),
    )
    comm.all_reduce(torch.ones(2))
    comm.all_gather_object(comm.rank)
    with pytest.raises(TypeError):
        comm.all_reduce("not a tensor")  # type: ignore[arg-type]
    sub = comm.split(color=0)
    sub.broadcast(torch.ones(3), src=0)
    handle.remove()
    handle.remove()  # twice is harmless
    comm.all_reduce(torch.ones(2))
    return seen


def test_hooks_see_every_call_and_removal_stops_them(run, world_size: int) -> None:
    expected = [
        ("pre", "all_reduce", 1, "running"),
        ("post", "all_reduce", 1, "done"),
        ("pre", "all_gather_object", 2, "running"),
        ("post", "all_gather_object", 2, "done"),
        ("pre", "all_reduce", 3, "running"),
        ("post", "all_reduce", 3, "failed"),
        ("pre", "split", 4, "running"),
        ("post", "split", 4, "done"),
        ("pre", "broadcast", 1, "running"),  # the subgroup's first collective reaches the parent's hooks
        ("post", "broadcast", 1, "done"),
    ]
    assert run(hooks_see_every_call) == [expected] * world_size


def event_fields(comm: Communicator) -> dict[str, Any]:
    events: list[Event] = []
    comm.add_hook(post=events.append)
    comm.all_gather([torch.ones(2, 3, dtype=torch.float16)][0])
    sub = comm.new_group(list(range(comm.world_size - 1, -1, -1)))
    sub.all_reduce(torch.zeros(4, dtype=torch.int32))
    first, second = events[0], events[-1]
    return {
        "first": (first.op, first.dtypes, first.shapes, first.group, first.rank, first.world, first.error),
        "site": first.site,
        "second": (second.op, second.dtypes, second.group, second.rank, second.describe_sizes()),
        "durations": all(e.duration >= 0 for e in events),
        "dict": json.dumps(second.as_dict()),
    }


def test_events_carry_op_sizes_dtypes_group_and_site(run, world_size: int) -> None:
    world = world_size
    for rank, fields in enumerate(run(event_fields)):
        assert fields["first"] == ("all_gather", (torch.float16,), (torch.Size([2, 3]),), "world", rank, world, None)
        assert fields["site"].startswith(__file__) or fields["site"] == "unknown"
        ranks = ",".join(str(r) for r in range(world - 1, -1, -1))
        assert fields["second"] == ("all_reduce", (torch.int32,), f"ranks {ranks}", world - 1 - rank, "int32[4]")
        assert fields["durations"]
        assert json.loads(fields["dict"])["dtypes"] == ["int32"]


def raising_hook(comm: Communicator) -> tuple[float, float, list[str]]:
    def broken(event: Event) -> None:
        if comm.rank == 0:
            raise RuntimeError(f"hook broke on {event.op}")

    comm.add_hook(pre=broken, post=broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = comm.all_reduce(torch.ones(1)).item()
        again = comm.all_reduce(torch.ones(1)).item()  # the ranks are still in step
    return first, again, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def test_a_raising_hook_warns_and_leaves_the_collective_alone(run, world_size: int) -> None:
    results = run(raising_hook)
    for rank, (first, again, messages) in enumerate(results):
        assert first == again == world_size
        if rank == 0:
            assert len(messages) == 4 and all("hook broke on all_reduce" in m for m in messages)
            assert "went on unaffected" in messages[0]
        else:
            assert messages == []


def add_hook_checks(comm: Communicator) -> bool:
    with pytest.raises(ValueError, match="pre or a post"):
        comm.add_hook()
    with pytest.raises(TypeError, match="callable"):
        comm.add_hook(pre=42)  # type: ignore[arg-type]
    return True


@pytest.mark.world_size(1)
def test_add_hook_refuses_nothing_to_call(run) -> None:
    assert run(add_hook_checks) == [True]


def profiled(comm: Communicator, directory: str, record_shapes: bool) -> list[dict[str, Any]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=record_shapes) as prof:
        comm.all_reduce(torch.ones(16))
        comm.all_gather_object({"rank": comm.rank})
        comm.reduce_scatter([torch.ones(2, 5) for _ in range(comm.world_size)])
    path = os.path.join(directory, f"trace-{record_shapes}-{comm.rank}.json")
    prof.export_chrome_trace(path)
    with open(path) as trace:
        events = json.load(trace)["traceEvents"]
    return [e for e in events if str(e.get("name", "")).startswith("communicator.")]


@pytest.mark.world_size(1, 2)
@pytest.mark.parametrize("record_shapes", [False, True])
def test_the_profiler_trace_holds_a_named_range_with_sizes(run, tmp_path, record_shapes: bool) -> None:
    for ranges in run(profiled, str(tmp_path), record_shapes):
        names = {e["name"] for e in ranges}
        assert {"communicator.all_reduce", "communicator.all_reduce float32[16]"} <= names
        assert {"communicator.all_gather_object", "communicator.reduce_scatter"} <= names
        outer = next(e for e in ranges if e["name"] == "communicator.all_reduce")
        inner = next(e for e in ranges if e["name"] == "communicator.all_reduce float32[16]")
        assert outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]
        assert any(name.startswith("communicator.reduce_scatter float32[2, 5]") for name in names)
        if record_shapes:  # the tensors are the range's inputs, like any torch op's
            assert outer["args"]["Input Dims"] == [[16]]


def recorder(comm: Communicator, directory: str) -> dict[str, Any]:
    for _ in range(5):
        comm.all_reduce(torch.ones(1))
    comm.broadcast_object("x")
    kept = [(e.op, e.seq, e.state) for e in comm.events()]
    path = comm.dump_trace(directory)
    with open(path) as dump:
        record = json.load(dump)
    return {"kept": kept, "path": os.path.basename(path), "record": record}


def test_the_flight_recorder_keeps_the_last_operations_and_dumps_them(run, world_size: int, tmp_path) -> None:
    results = run(recorder, str(tmp_path), cfg={"trace_events": 3, "launcher": "auto"})
    for rank, result in enumerate(results):
        assert result["kept"] == [("all_reduce", 4, "done"), ("all_reduce", 5, "done"), ("broadcast_object", 6, "done")]
        assert result["path"] == f"world-rank{rank}.json"
        record = result["record"]
        assert record["rank"] == rank and record["world_size"] == world_size and record["seq"] == 6
        assert [e["op"] for e in record["events"]] == ["all_reduce", "all_reduce", "broadcast_object"]
        assert record["events"][0]["shapes"] == [[1]] and record["events"][0]["dtypes"] == ["float32"]


def failure_dumps(comm: Communicator) -> str:
    comm.all_reduce(torch.ones(1))
    if comm.rank == 1:
        obj: object = lambda: None  # noqa: E731 - cannot be pickled
    else:
        obj = comm.rank
    with pytest.raises(AttributeError if comm.rank == 1 else RemoteError) as caught:  # pickling fails on rank 1
        comm.all_gather_object(obj)
    assert comm.all_reduce(torch.ones(1)).item() == comm.world_size  # the group is intact
    return "\n".join(getattr(caught.value, "__notes__", []))


@pytest.mark.world_size(2, 3)
def test_a_failed_operation_dumps_every_rank_s_recorder(run, world_size: int, tmp_path) -> None:
    notes = run(failure_dumps, cfg={"trace_dir": str(tmp_path), "launcher": "auto"})
    for rank in range(world_size):
        path = tmp_path / f"world-rank{rank}.json"
        assert f"{path}" in notes[rank]
        events = json.loads(path.read_text())["events"]
        assert [(e["op"], e["state"]) for e in events] == [("all_reduce", "done"), ("all_gather_object", "failed")]
        assert events[-1]["site"].startswith(__file__)
        assert events[-1]["error"].startswith("AttributeError" if rank == 1 else "RemoteError")


def mismatched_in_debug(comm: Communicator) -> str:
    with pytest.raises(CollectiveMismatchError) as caught:
        comm.all_reduce(torch.ones(2 + comm.rank))
    return str(caught.value)


@pytest.mark.world_size(2)
def test_debug_mismatch_names_the_call_site(run, tmp_path) -> None:
    messages = run(mismatched_in_debug, cfg={"debug": True, "trace_dir": str(tmp_path), "launcher": "auto"})
    assert all("test_observe.py:" in message for message in messages)
    assert (tmp_path / "world-rank0.json").exists()


@pytest.mark.world_size(1)
def test_statistics_table_and_json(run) -> None:
    def table(comm: Communicator) -> tuple[str, str]:
        comm.all_reduce(torch.ones(250_000))
        comm.all_gather_object("x")
        return str(comm.stats()), comm.stats().to_json()

    [(text, as_json)] = run(table, cfg={"stats": True, "launcher": "none"})
    header, reduce_line, object_line = text.splitlines()
    assert header.split()[:5] == ["group", "op", "calls", "sent", "received"]
    assert reduce_line.split()[:5] == ["world", "all_reduce", "1", "0", "B"]  # one process sends nothing
    assert reduce_line.endswith("0 B/s")  # a bus bandwidth factor of 0 in a world of one
    assert object_line.split()[1] == "all_gather_object" and object_line.rstrip().endswith("-")
    assert [row["op"] for row in json.loads(as_json)] == ["all_reduce", "all_gather_object"]
    with pytest.raises(KeyError):
        Statistics()["all_reduce"]


def test_closing_a_communicator_ends_its_observation() -> None:
    before = CallState.observers
    comm = Communicator.create({"launcher": "none", "stats": True})
    comm.add_hook(post=lambda event: None)
    assert CallState.observers == before + 2  # every call in the process now takes the observed path
    comm.all_reduce(torch.ones(1))
    comm.close()
    assert CallState.observers == before  # ... and no longer once it is closed
    assert comm.stats()["all_reduce"].calls == 1  # its numbers stay readable


def nested_in_hooks(comm: Communicator) -> tuple[list[float], list[str], list[str]]:
    """Rank 0's hooks try operations on the communicator they observe, and on a subgroup's parent."""
    refused: list[str] = []

    def pre(event: Event) -> None:
        if comm.rank == 0 and event.op == "all_reduce":
            try:
                comm.all_reduce(torch.full((1,), 100.0))  # unguarded, this paired with rank 1's real call
            except CommError as error:
                refused.append(str(error))
            comm.barrier()  # not caught: the hook's error becomes a warning

    sub = comm.split(color=0)  # every rank: a subgroup whose operations the parent's hooks see
    handle = comm.add_hook(pre=pre)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        totals = [comm.all_reduce(torch.ones(1)).item(), sub.all_reduce(torch.ones(1)).item()]
    handle.remove()
    totals.append(comm.all_reduce(torch.ones(1)).item())  # still in step, hooks off
    sub.close()
    return totals, refused, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def test_a_hook_cannot_issue_operations_on_what_it_observes(run, world_size: int) -> None:
    for rank, (totals, refused, warned) in enumerate(run(nested_in_hooks)):
        assert totals == [world_size] * 3  # nothing mixed into the real collectives
        if rank == 0:
            assert len(refused) == 2 and all("a hook cannot issue operations" in m for m in refused), refused
            assert "all_reduce: " in refused[0] and "(nothing was sent)" in refused[0]
            assert len(warned) == 2 and all("CommError: barrier: a hook cannot issue" in m for m in warned), warned
        else:
            assert refused == warned == []
    assert CallState.hooks_running == 0


@pytest.mark.world_size(1)
@pytest.mark.parametrize("stage", ["pre", "post"])
@pytest.mark.parametrize("kind", [KeyboardInterrupt, SystemExit])
def test_a_hook_that_raises_anything_leaves_the_recorder_and_status_consistent(
    stage: str, kind: type[BaseException]
) -> None:
    comm = Communicator.create({"launcher": "none", "stats": True})
    raised = []

    def interrupt(event: Event) -> None:
        if not raised:
            raised.append(event.op)
            raise kind("stop")

    comm.add_hook(**{stage: interrupt})
    with pytest.raises(kind):
        comm.all_reduce(torch.ones(1))
    [event] = comm.events()
    assert event.state == ("failed" if stage == "pre" else "done"), event
    assert stage == "post" or event.error == f"{kind.__name__}: stop"
    assert comm._calls.event is None and CallState.hooks_running == 0  # the status says nothing runs
    assert comm.stats()["all_reduce"].calls == 1
    assert comm.all_reduce(torch.ones(1)).item() == 1.0  # the communicator goes on
    assert [e.state for e in comm.events()][1:] == ["done"]
    comm.close()
