"""Object collectives, dict reduction and result collection on NonDistComm and real gloo ranks."""

from __future__ import annotations

import pickle
import time
import warnings
from collections.abc import Callable

import numpy as np
import pytest
import torch

from communicator import CollectiveMismatchError, Communicator, RemoteError
from communicator.check.equality import same_value as _same
from communicator.testing import run_ranks, run_single

pytestmark = pytest.mark.world_size(1, 2, 3, 4)


def _payload(rank: int, big: bool = False) -> dict[str, object]:
    size = 50_000 if big else 3
    return {
        "rank": rank,
        "none": None,
        "text": "x" * rank,
        "array": np.arange(size * (rank + 1), dtype=np.float32),
        "tensor": torch.arange(size, dtype=torch.bfloat16) + rank,
        "nested": [{"i": i, "t": torch.tensor([i, rank])} for i in range(rank)],
        "ints": np.int64(rank),
    }


def object_collectives(comm: Communicator, big: bool) -> bool:
    world, rank = comm.world_size, comm.rank
    everyone = comm.all_gather_object(_payload(rank, big))
    assert len(everyone) == world and all(_same(everyone[r], _payload(r, big)) for r in range(world))
    for root in range(world):
        got = comm.gather_object(_payload(rank, big), dst=root)
        assert (got is None) == (rank != root)
        if got is not None:
            assert all(_same(got[r], _payload(r, big)) for r in range(world))
        sent = comm.broadcast_object(_payload(root, big) if rank == root else None, src=root)
        assert _same(sent, _payload(root, big))
        mine = comm.scatter_object([_payload(r, big) for r in range(world)] if rank == root else None, src=root)
        assert _same(mine, _payload(rank, big))
        objects = [1, "a", None] if rank == root else [None, None, None]
        assert comm.broadcast_object_list(objects, src=root) is objects and objects == [1, "a", None]
    assert comm.all_gather_object(None) == [None] * world
    if world > 1:
        peer = (rank + 1) % world
        if rank % 2 == 0:
            comm.send_object(_payload(rank, big), dst=peer)
            got_p2p = comm.recv_object(src=(rank - 1) % world)
        else:
            got_p2p = comm.recv_object(src=(rank - 1) % world)
            comm.send_object(_payload(rank, big), dst=peer)
        assert _same(got_p2p, _payload((rank - 1) % world, big))
    return True


@pytest.mark.parametrize("big", [False, True], ids=["inline", "large"])
def test_every_object_method_every_root(run, big: bool) -> None:
    assert all(run(object_collectives, big))


def unpicklable_on_last_rank(comm: Communicator) -> str:
    obj = (lambda: 0) if comm.rank == comm.world_size - 1 else {"ok": comm.rank}
    try:
        comm.all_gather_object(obj)
    except RemoteError as error:
        assert error.rank == comm.world_size - 1
        outcome = f"remote {error.error_type}"
    except (pickle.PicklingError, AttributeError) as error:
        outcome = f"own {type(error).__name__}"
    else:
        return "no error"
    # the group is intact: the failure travelled in-band
    assert comm.all_gather_object(comm.rank) == list(range(comm.world_size))
    return outcome


@pytest.mark.world_size(2, 3, 4)
def test_unserialisable_object_fails_on_every_rank_and_group_survives(run, world_size: int) -> None:
    outcomes = run(unpicklable_on_last_rank)
    assert outcomes[-1].startswith("own")
    assert all(o.startswith("remote") for o in outcomes[:-1])


class Point:
    def __init__(self, x: int) -> None:
        self.x = x


def safe_mode(comm: Communicator) -> str:
    import collections

    allowed = {"a": np.arange(3), "t": torch.ones(2), "d": collections.OrderedDict(x=1), "s": {1, 2}}
    assert _same(comm.all_gather_object(allowed)[0]["a"], np.arange(3))
    obj = Point(1) if comm.rank == 0 else None
    try:
        comm.broadcast_object(obj, src=0)
    except RemoteError as error:
        return f"remote {error.error_type}"
    except Exception as error:  # noqa: BLE001
        return f"own {type(error).__name__}: {error}"
    return "accepted"


@pytest.mark.world_size(1, 2, 3)
def test_safe_serializer_refuses_untrusted_classes_on_every_rank(run, world_size: int) -> None:
    outcomes = run(safe_mode, cfg={"serializer": "safe", "backend": "gloo"})
    if world_size == 1:
        assert outcomes == ["accepted"]  # a single process serialises nothing
        return
    assert outcomes[0].startswith("own UnsafePayloadError") and "trusted" in outcomes[0]
    assert all(o == "remote UnsafePayloadError" for o in outcomes[1:])


def dict_reduction(comm: Communicator) -> bool:
    world, rank = comm.world_size, comm.rank
    data = {
        "loss": torch.tensor(float(rank)),
        "count": torch.tensor(rank + 1, dtype=torch.int32),
        "half": torch.full((2,), rank, dtype=torch.float16),
        "nested": {"n": rank, "f": 0.5 * rank, "flag": rank == 0, "np": np.float32(rank)},
    }
    total = comm.all_reduce_dict(data)
    assert total["loss"].dtype == torch.float32 and total["loss"].item() == sum(range(world))
    assert total["count"].dtype == torch.int32 and total["count"].item() == sum(r + 1 for r in range(world))
    assert total["half"].dtype == torch.float16 and total["half"].tolist() == [sum(range(world))] * 2
    assert total["nested"]["n"] == sum(range(world)) and isinstance(total["nested"]["n"], int)
    assert total["nested"]["flag"] is True and isinstance(total["nested"]["np"], np.float32)
    mean = comm.all_reduce_dict(data, op="mean")
    assert mean["count"].dtype == torch.float64  # integer means are not truncated
    assert mean["count"].item() == pytest.approx(sum(r + 1 for r in range(world)) / world)
    assert mean["nested"]["n"] == pytest.approx(sum(range(world)) / world)
    assert comm.all_reduce_dict(data, op="max")["loss"].item() == world - 1
    big = {f"w{i}": torch.full((1000,), float(rank)) for i in range(10)} | {"i": torch.ones(5, dtype=torch.int64)}
    reduced = comm.all_reduce_dict(big, op="mean")
    assert reduced["w3"].tolist() == [sum(range(world)) / world] * 1000 and reduced["i"].dtype == torch.float64
    assert data["loss"].item() == float(rank)  # the input is not modified
    return True


def test_all_reduce_dict_keeps_dtypes_and_structure(run) -> None:
    assert all(run(dict_reduction))


def mismatched_keys(comm: Communicator) -> str:
    data = {"a": torch.ones(1), "b": torch.ones(1)} if comm.rank == 0 else {"a": torch.ones(1), "c": torch.ones(2)}
    try:
        comm.all_reduce_dict(data)
    except CollectiveMismatchError as error:
        assert comm.all_reduce_dict({"ok": 1})["ok"] == comm.world_size  # still usable
        return str(error)
    return "no error"


@pytest.mark.world_size(2, 3)
def test_all_reduce_dict_names_mismatched_keys_on_every_rank(run) -> None:
    for message in run(mismatched_keys):
        assert "'b'" in message and "'c'" in message and "missing keys" in message


def collect(comm: Communicator, size: int, order: str) -> list[object] | None:
    world, rank = comm.world_size, comm.rank
    if order == "interleave":
        per_rank = -(-size // world)
        part = [(rank + world * k) % size if size else None for k in range(per_rank)]  # sampler padding wraps
        part = [None if i is not None and i % 5 == 0 else i for i in part]  # real None results
    else:
        chunk = -(-size // world)
        part = list(range(rank * chunk, min(size, (rank + 1) * chunk)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return comm.collect_results(part, size=size, order=order)  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [0, 1, 7, 10])
@pytest.mark.parametrize("order", ["interleave", "contiguous"])
def test_collect_results_dataset_order(run, world_size: int, size: int, order: str) -> None:
    results = run(collect, size, order)
    expected = [None if (order == "interleave" and i % 5 == 0) else i for i in range(size)]
    assert results[0] == expected
    assert results[1:] == [None] * (world_size - 1)


def collect_more_than_held(comm: Communicator) -> tuple[list[int] | None, int]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = comm.collect_results([comm.rank], size=comm.world_size + 3, dst=comm.world_size - 1)
    return got, len(caught)


def test_collect_results_never_pads(run, world_size: int) -> None:
    results = run(collect_more_than_held)
    assert results[-1] == (list(range(world_size)), 1)
    assert all(r == (None, 0) for r in results[:-1])


def seeds(comm: Communicator) -> tuple[int, int, bool, str]:
    import random

    np.random.seed(comm.rank)
    torch.manual_seed(comm.rank)
    random.seed(comm.rank)
    before = (np.random.get_state()[1][:4].tolist(), torch.get_rng_state()[:8].tolist(), random.getstate()[1][:4])
    seed = comm.sync_random_seed()
    fixed = comm.sync_random_seed(42 + comm.rank)
    after = (np.random.get_state()[1][:4].tolist(), torch.get_rng_state()[:8].tolist(), random.getstate()[1][:4])
    assert before == after  # the global generators are untouched
    agree = comm.check_random_states()
    torch.manual_seed(7)
    np.random.seed(7)
    random.seed(7)
    return seed, fixed, agree, str(comm.check_random_states())


def test_sync_random_seed(run, world_size: int) -> None:
    results = run(seeds)
    assert len({r[0] for r in results}) == 1 and all(r[1] == 42 for r in results)
    assert [r[2] for r in results] == [world_size == 1] * world_size
    assert [r[3] for r in results] == ["True"] * world_size


def object_argument_errors(comm: Communicator) -> bool:
    with pytest.raises(ValueError, match="out of range"):
        comm.gather_object(1, dst=comm.world_size)
    with pytest.raises(TypeError, match="list"):
        comm.broadcast_object_list((1, 2))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="results must be"):
        comm.collect_results("abc", size=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="order"):
        comm.collect_results([1], size=1, order="random")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="size"):
        comm.collect_results([1], size=-1)
    with pytest.raises(TypeError, match="tensor or a number"):
        comm.all_reduce_dict({"a": "text"})
    with pytest.raises(TypeError, match="seed"):
        comm.sync_random_seed("1")  # type: ignore[arg-type]
    return True


def test_object_argument_errors(run) -> None:
    assert all(run(object_argument_errors))


def unpicklable_in_gather(comm: Communicator, dst: int) -> str:
    obj = (lambda: 0) if comm.rank == 1 else {"big": np.zeros(100_000), "rank": comm.rank}
    try:
        comm.gather_object(obj, dst=dst)
    except RemoteError as error:
        assert error.rank == 1 and error.ranks == (1,)
        outcome = f"remote {error.error_type}"
    except (pickle.PicklingError, AttributeError) as error:
        outcome = f"own {type(error).__name__}"
    else:
        return "no error"
    got = comm.gather_object(comm.rank, dst=dst)  # the group is intact
    assert got == (list(range(comm.world_size)) if comm.rank == dst else None)
    return outcome


@pytest.mark.world_size(2, 3, 4)
@pytest.mark.parametrize("dst", [0, 1])
def test_gather_object_failure_reaches_every_rank(run, dst: int) -> None:
    outcomes = run(unpicklable_in_gather, dst)
    assert outcomes[1].startswith("own")
    assert all(o.startswith("remote") for r, o in enumerate(outcomes) if r != 1)


def seeded_sequence(comm: Communicator, numpy_seed: int, through_dist: bool) -> list[int]:
    import communicator.dist as cdist

    np.random.seed(numpy_seed)  # as mmengine's set_random_seed does
    state = np.random.get_state()[1].copy()
    draw = cdist.sync_random_seed if through_dist else comm.sync_random_seed
    drawn = [draw() for _ in range(3)]
    assert np.array_equal(np.random.get_state()[1], state)  # the global state did not move
    return drawn


@pytest.mark.parametrize("through_dist", [False, True], ids=["communicator", "communicator.dist"])
def test_seeded_runs_draw_the_same_seeds(run, world_size: int, through_dist: bool) -> None:
    first = run(seeded_sequence, 123, through_dist)
    again = run(seeded_sequence, 123, through_dist)
    other = run(seeded_sequence, 124, through_dist)
    assert first == again  # the same run, the same seeds: shuffles are reproducible
    assert all(seq == first[0] for seq in first)  # every rank agrees
    assert len(set(first[0])) == 3  # successive calls differ
    assert other[0] != first[0]


def chunked_collectives(comm: Communicator) -> bool:
    """Frames of several chunks, each rank with its own chunk size (the smallest buffer gives chunks of
    32 KiB): arrays and tensors inside one chunk, across chunks and across the pipeline's two buffers."""
    buffer = 64 * 1024 * (comm.rank + 1)
    with Communicator.create({"backend": "gloo", "object_buffer_bytes": buffer}) as chunked:
        return object_collectives(chunked, big=True)


@pytest.mark.world_size(2, 3)
def test_object_collectives_stream_in_chunks_of_each_senders_size(run) -> None:
    assert all(run(chunked_collectives))


def _ring_payload(rank: int) -> object:
    """Over 1 MiB (AT_ONCE_BYTES) but for rank 1's, which travels in its record."""
    return None if rank == 1 else [np.full((rank + 1) * 300_000, rank, dtype=np.float32), "x" * rank]


def ring_of_unequal_frames(comm: Communicator) -> bool:
    """all_gather_object around the ring: frames of unequal sizes and of several chunks, each rank
    with its own chunk size, one object inline; every rank's object reaches every rank."""
    with Communicator.create({"backend": "gloo", "object_buffer_bytes": 256 * 1024 * (comm.rank + 1)}) as chunked:
        for _ in range(2):  # the second call finds the first one's transfers all matched
            got = chunked.all_gather_object(_ring_payload(chunked.rank))
            assert all(_same(got[r], _ring_payload(r)) for r in range(chunked.world_size))
    return True


@pytest.mark.world_size(2, 3, 4)
def test_large_frames_go_around_the_ring_chunk_by_chunk(run) -> None:
    assert all(run(ring_of_unequal_frames))


def large_objects_alone(comm: Communicator) -> str:
    """Every object op with a frame that would go around the ring at more ranks."""
    big = _ring_payload(0)
    assert _same(comm.all_gather_object(big), [big]) and _same(comm.gather_object(big, 0), [big])
    assert _same(comm.broadcast_object(big, 0), big) and _same(comm.scatter_object([big], 0), big)
    return type(comm).__name__


def test_a_torch_group_of_one_rank_sends_no_object_to_itself() -> None:
    assert run_ranks(large_objects_alone, 1) == ["TorchComm"]


MiB = 1024 * 1024
BUFFER = 4 * MiB  # object_buffer_bytes in the memory test
PAYLOAD = 48 * MiB  # per rank: 12 arrays of 4 MiB


def _memory_payload(rank: int) -> list[np.ndarray]:
    return [np.full(MiB, rank + i, dtype=np.float32) for i in range(PAYLOAD // (4 * MiB))]


def _growth(call: object) -> tuple[int, object]:
    from benchmarks.memory import peak_growth_since, peak_growth_start

    start = peak_growth_start()
    result = call()  # type: ignore[operator]
    return peak_growth_since(start), result


def memory_growth(comm: Communicator) -> dict[str, int]:
    """How far each collective grew this rank's resident memory at its peak (bytes)."""
    payload = _memory_payload(comm.rank)
    comm.gather_object(payload, dst=0)  # warm up: the group's connections and buffers
    comm.barrier()
    time.sleep(0.2)  # the transfer thread lets the last frame go as soon as it runs
    grown: dict[str, int] = {}
    for name, call in (
        ("gather_object", lambda: comm.gather_object(payload, dst=0)),
        ("collect_results", lambda: comm.collect_results(payload, size=len(payload) * comm.world_size)),
        ("broadcast_object", lambda: comm.broadcast_object(payload if comm.rank == 0 else None, src=0)),
    ):
        grown[name], result = _growth(call)
        if name != "broadcast_object" and comm.rank == 0:
            assert result is not None and len(result) == comm.world_size * (1 if name == "gather_object" else 12)
        del result
        comm.barrier()
        time.sleep(0.2)
    return grown


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/clear_refs"), reason="needs Linux's peak RSS reset")
def test_object_collectives_memory_is_bounded() -> None:
    """The destination holds the received bytes and little more; a sender needs its staging buffer,
    not a copy of its payload (generous margins: other allocations of the process count too)."""
    from communicator.testing import run_ranks

    world = 3
    grown = run_ranks(memory_growth, world, cfg={"backend": "gloo", "object_buffer_bytes": BUFFER}, timeout=120)
    received = (world - 1) * PAYLOAD
    margin = 16 * MiB
    for op in ("gather_object", "collect_results"):
        assert grown[0][op] <= received + margin, (op, grown[0][op] / MiB)
        for rank in range(1, world):  # a full copy of the payload would be 48 MiB
            assert grown[rank][op] <= BUFFER + margin, (op, rank, grown[rank][op] / MiB)
    assert grown[0]["broadcast_object"] <= BUFFER + margin, grown[0]["broadcast_object"] / MiB
    for rank in range(1, world):  # the source's frame, received once, in place
        assert grown[rank]["broadcast_object"] <= PAYLOAD + margin, grown[rank]["broadcast_object"] / MiB


_NOT_A_RANK = "must be an int rank of this communicator, got"
#: A bad argument of each object method, and its error on a world of ``w`` ranks (the last is ``w - 1``).
BAD_OBJECT_ARGUMENTS: list[tuple[Callable[[Communicator], object], str]] = [
    (lambda comm: comm.gather_object(1, dst="0"), f"TypeError: dst {_NOT_A_RANK} str"),
    (lambda comm: comm.broadcast_object(1, src=1.5), f"TypeError: src {_NOT_A_RANK} float"),
    (lambda comm: comm.broadcast_object_list((1,)), "TypeError: broadcast_object_list needs a list, got tuple"),
    (lambda comm: comm.broadcast_object_list([1], src=True), f"TypeError: src {_NOT_A_RANK} bool"),
    (
        lambda comm: comm.scatter_object(None, src=0),
        "ValueError: scatter_object: src must pass a sequence of {w} objects, got None",
    ),
    (
        lambda comm: comm.scatter_object("ab", src=0),
        "ValueError: scatter_object: src must pass a sequence of {w} objects, got str of length 2",
    ),
    (lambda comm: comm.send_object(1, dst=None), f"TypeError: dst {_NOT_A_RANK} NoneType"),
    (
        lambda comm: comm.recv_object(src=comm.world_size),
        "ValueError: src={w} is out of range: expected a rank in 0..{last} of this communicator",
    ),
]


def bad_object_arguments(comm: Communicator) -> list[str]:
    """The error of each of ``BAD_OBJECT_ARGUMENTS`` on this rank, as ``type: message``."""
    errors = []
    for call, _ in BAD_OBJECT_ARGUMENTS:
        try:
            call(comm)
        except Exception as error:  # noqa: BLE001 - every error is compared with the expected one
            errors.append(f"{type(error).__name__}: {error}")
        else:
            errors.append("no error")
    assert comm.all_gather_object(comm.rank) == list(range(comm.world_size))  # the group is intact
    return errors


@pytest.mark.world_size(1)
def test_a_bad_object_argument_gets_the_same_error_in_one_process_and_on_ranks() -> None:
    def expected(world: int) -> list[str]:
        return [message.format(w=world, last=world - 1) for _, message in BAD_OBJECT_ARGUMENTS]

    assert run_single(bad_object_arguments) == expected(1)
    assert run_ranks(bad_object_arguments, 2)[0] == expected(2)  # rank 0 is every scatter's src


@pytest.mark.world_size(1)
def test_one_process_returns_the_very_objects_unpickled() -> None:
    def identity(comm: Communicator) -> None:
        unpicklable = lambda: 0  # noqa: E731
        assert comm.all_gather_object(unpicklable)[0] is unpicklable
        assert comm.gather_object(unpicklable) == [unpicklable]
        assert comm.broadcast_object(unpicklable) is unpicklable
        assert comm.scatter_object([unpicklable]) is unpicklable
        items = [unpicklable]
        assert comm.broadcast_object_list(items) is items and items[0] is unpicklable

    run_single(identity)


NEVER = float("inf")  # CPUs per rank no host has: 2 ranks keep gloo's collectives


def record_steps(
    comm: Communicator, op: str, point_to_point_ranks: int, gather_broadcast_ranks: int, cpus: float = NEVER
) -> dict[str, int]:
    """How the records of one small object ``op`` travel on this rank, under the given limits (``cpus``:
    the CPUs per rank from which 2 ranks go point to point): records sent or received point to point,
    gathers, broadcasts, and the waits for them."""
    from communicator.arguments import RECORD_TAG
    from communicator.transports import torch_channel

    limits = {
        "POINT_TO_POINT_RANKS": point_to_point_ranks,
        "GATHER_BROADCAST_RANKS": gather_broadcast_ranks,
        "POINT_TO_POINT_CPUS": cpus,
    }
    saved = {name: getattr(torch_channel, name) for name in limits}
    for name, value in limits.items():
        setattr(torch_channel, name, value)
    channel = comm._objects().channel
    counts = {"transfers": 0, "gather": 0, "broadcast": 0, "waits": 0}

    def counted(name: str, call: Callable[..., object]) -> Callable[..., object]:
        def count(*args: object) -> object:
            counts[name] += 1
            return call(*args)

        return count

    start = channel._start  # type: ignore[attr-defined]

    def transfers(sends: list[object], recvs: list[object], tag: int) -> object:
        counts["transfers"] += (len(sends) + len(recvs)) * (tag == RECORD_TAG)
        return start(sends, recvs, tag)

    channel._start = transfers  # type: ignore[attr-defined]
    channel._wait = counted("waits", channel._wait)  # type: ignore[attr-defined]
    channel.gather = counted("gather", channel.gather)  # type: ignore[method-assign]
    channel.broadcast = counted("broadcast", channel.broadcast)  # type: ignore[method-assign]
    value, every = {"rank": comm.rank}, [{"rank": r} for r in range(comm.world_size)]
    try:
        if op == "all_gather_object":
            assert comm.all_gather_object(value) == every
        elif op == "broadcast_object":
            assert comm.broadcast_object(value, src=1) == every[1]
        elif op == "gather_object":
            assert comm.gather_object(value, dst=1) == (every if comm.rank == 1 else None)
        else:
            assert comm.scatter_object(every if comm.rank == 1 else None, src=1) == value
    finally:
        for name, value in saved.items():
            setattr(torch_channel, name, value)
    return counts


def records_travel(comm: Communicator, cpus_of_rank: list[float]) -> tuple[bool, tuple[object, ...]]:
    from communicator.transports import torch_channel

    torch_channel.POINT_TO_POINT_CPUS = cpus_of_rank[comm.rank]  # what this rank's host offers, in effect
    every = comm.all_gather_object({"rank": comm.rank})
    gathered = comm.gather_object(comm.rank, dst=1)
    sent = comm.broadcast_object("from 1" if comm.rank == 1 else None, src=1)
    return comm._objects().channel._point_to_point, (every, gathered, sent)  # type: ignore[attr-defined]


@pytest.mark.world_size(2)
def test_two_ranks_agree_how_records_travel(run) -> None:
    """Each of 2 ranks judges the CPUs its own host has per rank and tells the other; both go point
    to point only when both offer it, so a rank with CPUs to spare and one without both keep gloo's
    collectives (deciding apart, one would wait in a transfer the other never posts)."""
    every = [{"rank": 0}, {"rank": 1}]
    for cpus, point_to_point in (([0.0, 0.0], True), ([0.0, NEVER], False), ([NEVER, 0.0], False)):
        results = run(records_travel, cpus)
        assert [travel for travel, _ in results] == [point_to_point] * 2
        assert [got for _, got in results] == [(every, None, "from 1"), (every, [0, 1], "from 1")]


@pytest.mark.world_size(2, 3, 4)
def test_records_are_all_gathered_in_two_steps(run, world_size: int) -> None:
    """gloo's ring all_gather takes a step per rank: up to GATHER_BROADCAST_RANKS the records go to
    rank 0 and back in one broadcast, point to point from 3 ranks up to POINT_TO_POINT_RANKS
    (where the other ranks post both transfers at once and wait once); beyond, the ring is used."""
    in_collectives = {"transfers": 0, "gather": 1, "broadcast": 1, "waits": 2}
    # to rank 0 and back, point to point
    point_to_point = [{"transfers": 2 * (world_size - 1), "gather": 1, "broadcast": 1, "waits": 2}]
    point_to_point += [{"transfers": 2, "gather": 0, "broadcast": 0, "waits": 1}] * (world_size - 1)
    expected = [in_collectives] * 2 if world_size == 2 else point_to_point
    assert run(record_steps, "all_gather_object", 8, 16) == expected
    assert run(record_steps, "all_gather_object", 8, 16, 0.0) == point_to_point  # 2 ranks with CPUs to spare
    assert run(record_steps, "all_gather_object", 1, 16) == [in_collectives] * world_size
    ring = {"transfers": 0, "gather": 0, "broadcast": 0, "waits": 1}
    assert run(record_steps, "all_gather_object", 1, 1) == [ring] * world_size


@pytest.mark.world_size(2, 3, 4)
@pytest.mark.parametrize("op", ["broadcast_object", "scatter_object", "gather_object"])
def test_records_go_point_to_point_from_three_to_eight_ranks(run, world_size: int, op: str) -> None:
    """A small object's records travel between rank 1 (the root here) and every other rank at once,
    from 3 ranks up to POINT_TO_POINT_RANKS: one transfer from the root for broadcast_object and
    scatter_object, one to it and the verdict back for gather_object (posted together on the other
    ranks, and waited on once). With 2 ranks, so too where both have CPUs to spare; else, and beyond,
    in gloo's broadcast, scatter or gather."""
    steps = 2 if op == "gather_object" else 1
    counts = {
        "transfers": steps,
        "gather": int(op == "gather_object"),
        "broadcast": int(op != "scatter_object"),
        "waits": steps,
    }
    point_to_point = [{**counts, "gather": 0, "broadcast": 0, "waits": 1} if steps == 2 else counts] * world_size
    point_to_point[1] = {**counts, "transfers": steps * (world_size - 1)}
    in_collectives = [{**counts, "transfers": 0}] * world_size
    assert run(record_steps, op, 8, 16) == (in_collectives if world_size == 2 else point_to_point)
    assert run(record_steps, op, 8, 16, 0.0) == point_to_point  # 2 ranks with CPUs to spare
    assert run(record_steps, op, world_size - 1, 16) == in_collectives
