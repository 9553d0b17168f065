"""Data x model parallelism on a 2 x 2 grid of ranks, checked against one process.

``comm.grid((2, 2))`` places rank ``r`` at row ``r // 2``, column ``r % 2`` and returns two
communicators:

- ``row``: the ranks of this row, which share one batch of data and split the model
  (tensor parallel). ``row.rank`` says which shard of the weights this rank holds.
- ``col``: the ranks of this column, which hold the same shard and see different data
  (data parallel). ``col.rank`` says which batch this rank reads.

The model is a two-layer MLP split the Megatron way: the first weight by output columns, the
second by input rows, so the forward pass needs one ``row.all_reduce`` and no gather. The
gradients of each shard are averaged over the column with ``col.all_reduce(op="mean")``. Every
rank then checks its shard's output, gradients and updated weights against the full model trained
on both batches in one process.

Run it with ``python docs/examples/subgroups.py`` (4 local gloo ranks).
"""

from __future__ import annotations

import torch

from communicator import Communicator, launch

ROWS, COLS = 2, 2  # rows: data-parallel replicas; cols: model shards
BATCH, FEATURES, HIDDEN, OUT = 16, 8, 12, 3
LR = 0.1


def make_problem() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The full weights and ROWS batches of data, the same in every process."""
    g = torch.Generator().manual_seed(0)
    w1 = torch.randn(FEATURES, HIDDEN, generator=g, dtype=torch.float64) / FEATURES**0.5
    w2 = torch.randn(HIDDEN, OUT, generator=g, dtype=torch.float64) / HIDDEN**0.5
    x = torch.randn(ROWS, BATCH, FEATURES, generator=g, dtype=torch.float64)
    y = torch.randn(ROWS, BATCH, OUT, generator=g, dtype=torch.float64)
    return w1, w2, x, y


def reference() -> dict[str, torch.Tensor]:
    """The full model on all the data, in one process."""
    w1, w2, x, y = make_problem()
    w1.requires_grad_(True)
    w2.requires_grad_(True)
    z = torch.relu(x @ w1) @ w2  # (ROWS, BATCH, OUT)
    loss = ((z - y) ** 2).mean()
    loss.backward()
    return {
        "z": z.detach(),
        "loss": loss.detach(),
        "w1": (w1 - LR * w1.grad).detach(),
        "w2": (w2 - LR * w2.grad).detach(),
    }


def step(comm: Communicator) -> dict[str, object]:
    row, col = comm.grid((ROWS, COLS))
    batch, shard = col.rank, row.rank  # which data this rank reads, which weights it holds
    w1, w2, x, y = make_problem()
    columns = slice(shard * HIDDEN // COLS, (shard + 1) * HIDDEN // COLS)
    w1_shard = w1[:, columns].clone().requires_grad_(True)  # column-parallel
    w2_shard = w2[columns, :].clone().requires_grad_(True)  # row-parallel

    # Forward: each shard's partial output, summed over the row.
    partial = torch.relu(x[batch] @ w1_shard) @ w2_shard
    z = row.all_reduce(partial.detach().clone())  # the full output for this batch
    z.requires_grad_(True)
    loss = ((z - y[batch]) ** 2).mean()
    loss.backward()
    partial.backward(z.grad)  # d(sum of partials)/d(partial) is the identity

    # Data parallel: average each shard's gradients over the batches of the column.
    for weight in (w1_shard, w2_shard):
        col.all_reduce(weight.grad, op="mean")
        with torch.no_grad():
            weight -= LR * weight.grad
    mean_loss = col.all_reduce(loss.detach().clone(), op="mean")

    expected = reference()
    checks = {
        "output": torch.allclose(z.detach(), expected["z"][batch]),
        "loss": torch.allclose(mean_loss, expected["loss"]),
        "w1 shard": torch.allclose(w1_shard.detach(), expected["w1"][:, columns]),
        "w2 shard": torch.allclose(w2_shard.detach(), expected["w2"][columns, :]),
    }
    return {
        "rank": comm.rank,
        "row": row.global_ranks,
        "col": col.global_ranks,
        "batch": batch,
        "shard": shard,
        "loss": mean_loss.item(),
        "checks": checks,
    }


def main() -> list[dict[str, object]]:
    outcomes = launch(step, ROWS * COLS)
    for o in outcomes:
        print(
            f"rank {o['rank']}: row group {list(o['row'])} (shard {o['shard']}), "
            f"col group {list(o['col'])} (batch {o['batch']}), loss {o['loss']:.6f}, "
            + ", ".join(f"{name} {'ok' if ok else 'WRONG'}" for name, ok in o["checks"].items())
        )
        assert all(o["checks"].values()), o
    assert len({o["loss"] for o in outcomes}) == 1
    return outcomes


if __name__ == "__main__":
    main()
