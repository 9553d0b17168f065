"""Data-parallel SGD that goes on after a rank is lost, checked against a run of the survivors.

Four ranks train a linear model; each takes its share of every global batch and the gradients
are summed with ``all_reduce``. In the middle of the second epoch rank 2 is killed (SIGKILL, no
goodbye). The other three get ``PeerLostError`` or ``RemoteError`` from the step's
``all_reduce``, call ``shrink()`` and go on as ranks 0, 1, 2 of 3:

- the model is restored from a surviving replica: broadcast from the new rank 0, not read from disk;
- the data is re-sharded: each global batch is now split three ways;
- the interrupted step runs again, and training finishes.

The result must equal a 3-rank run started from the model at that step. Run it with
``python docs/examples/elastic_sgd.py``: ``launch(..., on_failure="continue")`` lets the survivors
run on after a rank dies (see docs/recovery.md for what each launcher allows).
"""

from __future__ import annotations

import os
import signal

import torch

from communicator import CommError, Communicator, launch
from communicator.errors import RemoteFailure

FEATURES, SAMPLES, GLOBAL_BATCH, EPOCHS = 6, 240, 24, 2
LOST_RANK, LOST_AT = 2, 13  # the global step at which rank 2 dies: the 4th step of the 2nd epoch
STEPS_PER_EPOCH = SAMPLES // GLOBAL_BATCH


def make_data() -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed regression problem, the same in every process."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, dtype=torch.float64, generator=generator)
    y = x @ torch.linspace(-1.0, 1.0, FEATURES, dtype=torch.float64) + 0.01 * torch.randn(
        SAMPLES, dtype=torch.float64, generator=generator
    )
    return x, y


def batch_of(step: int) -> torch.Tensor:
    """The sample indices of global step ``step``: a shuffle per epoch, one global batch a step."""
    order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(step // STEPS_PER_EPOCH))
    first = (step % STEPS_PER_EPOCH) * GLOBAL_BATCH
    return order[first : first + GLOBAL_BATCH]


def sgd_step(comm: Communicator, weights: torch.Tensor, step: int) -> torch.Tensor:
    """One step: this rank's share of the batch, gradients summed over every rank."""
    x, y = make_data()
    mine = batch_of(step)[comm.rank :: comm.world_size]  # re-sharded whenever the world changes
    error = x[mine] @ weights - y[mine]
    gradient = comm.all_reduce(2 * x[mine].T @ error)  # sum over ranks
    return weights - 0.05 * gradient / GLOBAL_BATCH


def train(comm: Communicator, weights: torch.Tensor, first_step: int) -> dict[str, object]:
    """Train from ``first_step`` to the end; after a lost rank, go on with the survivors."""
    restored_at: int | None = None
    restored: torch.Tensor | None = None
    step = first_step
    while step < EPOCHS * STEPS_PER_EPOCH:
        if step == LOST_AT and comm.rank == LOST_RANK and comm.world_size == 4:
            os.kill(os.getpid(), signal.SIGKILL)  # a crash: no exception, no goodbye
        try:
            weights = sgd_step(comm, weights, step)
        except CommError:  # PeerLostError on a rank that saw it, RemoteError on the others
            comm = comm.shrink()  # ranks 0, 1, 3 become 0, 1, 2 of 3
            weights = comm.broadcast(weights, src=0)  # the model of a surviving replica
            step = comm.broadcast_object(step, src=0)  # and its step: a rank may have finished one more
            restored_at, restored = step, weights.clone()
            continue  # the interrupted step runs again, on the new shards
        step += 1
    finished = comm.agree(True)  # every survivor got here (a member could have died at the end)
    return {
        "weights": weights,
        "world_size": comm.world_size,
        "restored_at": restored_at,
        "restored": restored,
        "finished": finished,
    }


def elastic(comm: Communicator) -> dict[str, object]:
    return train(comm, torch.zeros(FEATURES, dtype=torch.float64), 0)


def from_step(comm: Communicator, weights: torch.Tensor, step: int) -> dict[str, object]:
    return train(comm, weights, step)


def main() -> None:
    results = launch(elastic, 4, {"backend": "gloo", "timeout": 60}, on_failure="continue")
    lost = results[LOST_RANK]
    assert isinstance(lost, RemoteFailure) and "SIGKILL" in lost.message, lost
    survivors = [r for r in results if not isinstance(r, RemoteFailure)]
    assert len(survivors) == 3 and all(r["world_size"] == 3 and r["finished"] for r in survivors)
    assert {r["restored_at"] for r in survivors} == {LOST_AT}
    restored = survivors[0]["restored"]
    assert isinstance(restored, torch.Tensor)

    # The reference: three ranks started from the restored model at the step that was interrupted.
    reference = launch(from_step, 3, {"backend": "gloo", "timeout": 60}, args=(restored, LOST_AT))
    for survivor, expected in zip(survivors, reference, strict=True):
        assert torch.allclose(survivor["weights"], expected["weights"], rtol=0, atol=1e-12)  # type: ignore[arg-type]
    print(f"rank {LOST_RANK} was killed at step {LOST_AT}; 3 survivors shrank, restored the model from the new")
    print(f"rank 0 and finished: weights {survivors[0]['weights']}, as a 3-rank run from that step")


if __name__ == "__main__":
    main()
