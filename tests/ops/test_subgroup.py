"""SubgroupComm on 4 real ranks: every method with group-local ranks, splits, nesting, non-members."""

from __future__ import annotations

import pytest
import torch

from communicator import Communicator, NotMemberError, SubgroupComm
from communicator.testing import run_ranks

GROUPS = [[0, 1], [2, 3], [1, 3], [3, 1, 0], [2]]


def exercise(sub: Communicator, world_ranks: list[int]) -> None:
    """Every collective on ``sub``, checked with group-local ranks."""
    size, me = sub.world_size, sub.rank
    assert size == len(world_ranks) and sub.global_ranks == tuple(world_ranks)  # type: ignore[attr-defined]
    me_global = world_ranks[me]
    assert sub.to_global(me) == me_global and sub.to_local(me_global) == me  # type: ignore[attr-defined]
    t = torch.tensor([float(me_global)])
    sub.all_reduce(t)
    assert t.item() == sum(world_ranks)
    assert [x.item() for x in sub.all_gather(torch.tensor([me_global]))] == world_ranks
    assert sub.all_gather_object(me_global) == world_ranks
    for root in range(size):
        b = torch.tensor([me_global])
        sub.broadcast(b, src=root)
        assert b.item() == world_ranks[root]
        r = torch.tensor([1])
        sub.reduce(r, dst=root)
        assert r.item() == (size if me == root else 1)
        got = sub.gather(torch.tensor([me_global]), dst=root)
        assert (got is None) == (me != root) and (got is None or [x.item() for x in got] == world_ranks)
        objs = sub.gather_object({"g": me_global}, dst=root)
        assert objs is None if me != root else objs == [{"g": g} for g in world_ranks]
        assert sub.broadcast_object(me_global if me == root else None, src=root) == world_ranks[root]
        parts = [torch.tensor([10 * k]) for k in range(size)] if me == root else None
        assert sub.scatter(parts, src=root).item() == 10 * me
        assert sub.scatter_object([f"to{k}" for k in range(size)] if me == root else None, src=root) == f"to{me}"
        collected = sub.collect_results([me_global], size=size, dst=root)
        assert collected == (world_ranks if me == root else None)
    assert sub.reduce_scatter([torch.tensor([k]) for k in range(size)]).item() == me * size
    assert [x.item() for x in sub.all_to_all([torch.tensor([me * 10 + k]) for k in range(size)])] == [
        k * 10 + me for k in range(size)
    ]
    if size > 1:
        if me == 0:
            sub.send_object(("hi", me_global), dst=1)
            sub.send(torch.tensor([me_global]), dst=1)
        elif me == 1:
            assert sub.recv_object(src=0) == ("hi", world_ranks[0])
            assert sub.recv(torch.zeros(1, dtype=torch.int64), src=0).item() == world_ranks[0]
    assert sub.all_reduce_dict({"x": torch.tensor(1.0), "n": me_global}) == {
        "x": torch.tensor(float(size)),
        "n": sum(world_ranks),
    }
    seed = sub.sync_random_seed()
    assert len(set(sub.all_gather_object(seed))) == 1
    sub.barrier()
    sub.barrier(timeout=30)


def every_group(comm: Communicator) -> list[str]:
    report = []
    for ranks in GROUPS:
        sub = comm.new_group(ranks)
        assert isinstance(sub, SubgroupComm)
        if comm.rank in ranks:
            assert sub.is_member and sub.rank == ranks.index(comm.rank)  # order as given
            exercise(sub, ranks)
            report.append(f"{ranks}: member {sub.rank}")
        else:
            assert not sub.is_member and sub.rank == -1
            with pytest.raises(NotMemberError, match="not a member"):
                sub.all_gather_object(1)
            with pytest.raises(NotMemberError, match="not a member"):
                sub.barrier()
            with pytest.raises(NotMemberError, match="not a member"):
                sub.all_reduce(torch.ones(1))
            report.append(f"{ranks}: outside")
    return report


def test_every_method_on_every_group_with_local_ranks() -> None:
    reports = run_ranks(every_group, 4, timeout=120)
    assert reports[3][3] == "[3, 1, 0]: member 0"
    assert reports[2][4] == "[2]: member 0" and reports[0][4] == "[2]: outside"


def splits(comm: Communicator) -> dict[str, object]:
    parity = comm.split(color=comm.rank % 2)
    halves = comm.split(color=comm.rank // 2, key=-comm.rank)  # reversed order inside each half
    exercise(parity, [r for r in range(4) if r % 2 == comm.rank % 2])
    exercise(halves, sorted((r for r in range(4) if r // 2 == comm.rank // 2), reverse=True))
    nested = halves.split(color=0, key=halves.rank)  # a split of a split
    exercise(nested, list(halves.global_ranks))  # type: ignore[attr-defined]
    single = parity.split(color=parity.rank)  # single-member groups
    exercise(single, [comm.rank])
    nobody = comm.split(color=None if comm.rank == 0 else 1)
    if comm.rank == 0:
        assert not nobody.is_member  # type: ignore[attr-defined]
        with pytest.raises(NotMemberError):
            nobody.all_gather_object(0)
    else:
        exercise(nobody, [1, 2, 3])
    row, col = comm.grid((2, 2))
    exercise(row, [comm.rank // 2 * 2, comm.rank // 2 * 2 + 1])
    exercise(col, [comm.rank % 2, comm.rank % 2 + 2])
    again = comm.split(color=comm.rank % 2)  # same ranks again: the cached torch group is reused
    exercise(again, [r for r in range(4) if r % 2 == comm.rank % 2])
    return {"nested_parent": nested.parent is halves}  # type: ignore[attr-defined]


def test_splits_nested_single_member_and_grid() -> None:
    assert run_ranks(splits, 4, timeout=120) == [{"nested_parent": True}] * 4


def bad_groups(comm: Communicator) -> bool:
    with pytest.raises(ValueError, match="repeat"):
        comm.new_group([0, 0])
    with pytest.raises(ValueError, match="out of range"):
        comm.new_group([0, comm.world_size])
    with pytest.raises(TypeError, match="non-empty"):
        comm.new_group([])
    with pytest.raises(TypeError, match="color"):
        comm.split(color="red")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="places"):
        comm.grid((3, 3))
    return True


def test_bad_group_arguments() -> None:
    assert run_ranks(bad_groups, 2) == [True, True]


def two_nodes(comm: Communicator) -> tuple[int, int, list[int], list[int]]:
    local = comm.local_comm
    gathered = local.all_gather_object(comm.rank)
    assert local is comm.local_comm  # created once
    return comm.node_rank, comm.local_rank, list(local.global_ranks), gathered  # type: ignore[attr-defined]


def test_local_comm_on_two_simulated_nodes() -> None:
    def node_env(rank: int) -> dict[str, str]:
        return {"LOCAL_RANK": str(rank % 2), "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": str(rank // 2)}

    results = run_ranks(two_nodes, 4, env=node_env, timeout=60)
    assert results == [
        (0, 0, [0, 1], [0, 1]),
        (0, 1, [0, 1], [0, 1]),
        (1, 0, [2, 3], [2, 3]),
        (1, 1, [2, 3], [2, 3]),
    ]


def close_parent(comm: Communicator) -> bool:
    sub = comm.split(color=0)
    comm.close()
    return sub.closed and comm.closed


def test_closing_the_parent_closes_subgroups() -> None:
    assert run_ranks(close_parent, 2) == [True, True]


def test_nondist_splits_into_itself() -> None:
    from communicator.testing import run_single

    def check(comm: Communicator) -> bool:
        exercise(comm.split(color=0), [0])
        exercise(comm.new_group([0]), [0])
        row, col = comm.grid((1, 1))
        return comm.local_comm is comm and row.world_size == col.world_size == 1

    assert run_single(check)
