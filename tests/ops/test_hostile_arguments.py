"""Hostile arguments: tensors that cannot be written or have no data are refused before anything is
sent and release waiting peers; ranks that disagree on what must agree (shape, dtype, op, root,
``same_shape``) get a ``CollectiveMismatchError`` on every rank without debug mode; closed
communicators refuse their blocks."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch

from communicator import CollectiveMismatchError, Communicator, NonDistComm, RemoteError
from communicator.errors import CommError
from communicator.testing import run_ranks


def _closed_blocks(comm: Communicator) -> list[str]:
    comm.close()
    messages = []
    for block in (lambda: comm, comm.wait_for_main, comm.main_process_first):
        with pytest.raises(CommError) as caught, block():
            pytest.fail("the block ran on a closed communicator")
        messages.append(str(caught.value))
    with pytest.raises(CommError) as caught:
        comm.barrier()
    messages.append(str(caught.value))  # still "closed", not relabelled by the blocks
    return messages


@pytest.mark.world_size(1, 2)
def test_closed_communicators_refuse_their_blocks(run) -> None:
    for messages in run(_closed_blocks):
        assert [m.split(":")[0] for m in messages] == ["__enter__", "wait_for_main", "main_process_first", "barrier"]
        assert all("closed" in m for m in messages), messages


def test_a_single_process_passes_objects_through_without_serialising() -> None:
    lock = threading.Lock()  # cannot be pickled
    with NonDistComm() as comm:
        objects = [lock, "a"]
        assert comm.broadcast_object_list(objects) is objects and objects[0] is lock


UNWRITABLE: dict[str, Callable[[], torch.Tensor]] = {
    "meta": lambda: torch.ones(3, device="meta"),
    "expanded": lambda: torch.ones(1).expand(3),
    "unsupported dtype": lambda: torch.ones(3, dtype=torch.complex32),
}


def _refused_on_one_rank(comm: Communicator, kind: str, op: str) -> str:
    tensor = UNWRITABLE[kind]() if comm.rank == 0 else torch.ones(3)
    call = {"all_reduce": comm.all_reduce, "broadcast": comm.broadcast}[op]
    try:
        call(tensor)
    except (TypeError, ValueError, RemoteError) as error:
        outcome = type(error).__name__
    else:
        outcome = "no error"
    return outcome


@pytest.mark.parametrize("op", ["all_reduce", "broadcast"])
@pytest.mark.parametrize("kind", list(UNWRITABLE))
def test_tensors_without_data_or_writable_memory_are_refused_and_release_peers(kind: str, op: str) -> None:
    outcomes = run_ranks(_refused_on_one_rank, 2, kind, op, cfg={"launcher": "auto", "timeout": 60})
    assert outcomes[0] in ("TypeError", "ValueError") and outcomes[1] == "RemoteError", outcomes


#: What each rank passes, by rank: every pair must agree and does not.
MISMATCHES: dict[str, Callable[[Communicator], object]] = {
    "shape": lambda c: c.all_reduce(torch.ones(4 + c.rank)),
    "dtype, same size": lambda c: c.all_reduce(torch.ones(3, dtype=(torch.float32, torch.int32)[c.rank])),
    "dtype": lambda c: c.all_reduce(torch.ones(3, dtype=(torch.float32, torch.float64)[c.rank])),
    "op": lambda c: c.all_reduce(torch.ones(3), op=("sum", "max")[c.rank]),
    "broadcast": lambda c: c.broadcast(torch.ones((4, 2)[c.rank], dtype=(torch.float32, torch.float64)[c.rank])),
    "dst": lambda c: c.reduce(torch.ones(3), dst=c.rank),
    "same_shape": lambda c: c.all_gather(torch.ones(1 + c.rank), same_shape=True),
    "same_shape on one rank": lambda c: c.all_gather(torch.ones(2), same_shape=c.rank == 0),
    "reduce_scatter": lambda c: c.reduce_scatter([torch.ones(2 + c.rank)] * 2),
    "gather dst": lambda c: c.gather(torch.ones(2), dst=c.rank),
    "scatter src": lambda c: c.scatter([torch.ones(1)] * 2, src=c.rank),
    "broadcast_object src": lambda c: c.broadcast_object({"lr": 0.1}, src=c.rank),
    "gather_object dst": lambda c: c.gather_object(c.rank, dst=c.rank),
    "scatter_object src": lambda c: c.scatter_object(["a", "b"], src=c.rank),
    "broadcast_object_list src": lambda c: c.broadcast_object_list([1, 2], src=c.rank),
}


def _mismatched(comm: Communicator, case: str) -> tuple[str, float]:
    comm.all_reduce(torch.ones(1))
    with pytest.raises(CollectiveMismatchError) as caught:
        MISMATCHES[case](comm)
    after = torch.ones(1)
    comm.all_reduce(after)  # nothing moved: the communicator stays usable
    return str(caught.value), after.item()


@pytest.mark.parametrize("case", list(MISMATCHES))
def test_mismatched_arguments_fail_on_every_rank_without_debug_mode(case: str) -> None:
    results = run_ranks(_mismatched, 2, case, timeout=60)
    assert all("must agree" in message for message, _ in results), results
    assert [after for _, after in results] == [2.0, 2.0]


def _seen_on_one_rank(comm: Communicator) -> str:
    comm.all_reduce(torch.ones(4))  # both ranks have seen float32[4]; only rank 1 passes a new shape
    with pytest.raises(CollectiveMismatchError) as caught:
        comm.all_reduce(torch.ones(4 + comm.rank))
    return str(caught.value)


def test_a_mismatch_one_rank_has_seen_before_is_named_by_the_stall_diagnosis() -> None:
    cfg = {"launcher": "auto", "stall_seconds": 2, "timeout": 60}
    for message in run_ranks(_seen_on_one_rank, 2, cfg=cfg, timeout=60):
        assert "argument check" in message, message


def _repeated_calls(comm: Communicator) -> float:
    total = torch.zeros(1)
    for i in range(2100):  # past two sampled checks (every 1024th collective)
        if (comm.rank + i) % 3:  # ranks call from different lines: legitimate, and never checked apart
            total += comm.all_reduce(torch.ones(1))
        else:
            total += comm.all_reduce(torch.ones(1), op="SUM")
    return total.item()


def test_correct_programs_pass_the_sampled_checks() -> None:
    assert run_ranks(_repeated_calls, 3, timeout=120) == [2100.0 * 3] * 3


def _complex_parameters(comm: Communicator) -> list[list[complex]]:
    parameters = [torch.nn.Parameter(torch.tensor([1 + 1j, 2j]) * (comm.rank + 1)) for _ in range(comm.world_size)]
    product = comm.reduce_scatter(parameters, op="product")
    total = comm.reduce_scatter(parameters, op="sum")  # the communicator is still usable
    return [product.tolist(), total.tolist()]


def test_reduce_scatter_of_complex_parameters() -> None:
    """The product of complex numbers goes over point to point; parameters that require grad are
    read, never written through."""
    first, second = (torch.tensor([1 + 1j, 2j]) * r for r in (1, 2))
    want = [(first * second).tolist(), (first + second).tolist()]
    assert run_ranks(_complex_parameters, 2) == [want, want]


def _bool_sums(comm: Communicator) -> list[list[int]]:
    whole = torch.ones(4, dtype=torch.bool)
    strided = torch.ones(8, dtype=torch.bool)[::2]  # not contiguous: reduced on a copy, written back
    comm.all_reduce(whole)
    comm.all_reduce(strided)
    return [whole.view(torch.uint8).tolist(), strided.view(torch.uint8).tolist()]


def test_a_bool_sum_is_the_same_on_a_view_as_on_a_whole_tensor() -> None:
    """torch's gloo sums bools as bytes (True + True is a bool holding 2); a view gets those bytes too."""
    assert run_ranks(_bool_sums, 2) == [[[2] * 4, [2] * 4]] * 2
