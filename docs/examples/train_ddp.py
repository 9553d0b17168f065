"""Data-parallel training with DistributedDataParallel, checked against a single-process run.

Every rank trains the same small MLP on its share of each global batch; DDP averages the
gradients. The communicator supplies what DDP does not:

- ``sync_random_seed``: one seed for model initialisation and data shuffling, drawn on rank 0;
- ``all_reduce_dict``: the epoch's loss, summed over every rank's samples;
- ``collect_results``: the test-set predictions of every rank, in dataset order, on rank 0.

The same ``train`` function then runs in one process (a ``NonDistComm``: no DDP, the whole global
batch at once) with the same seed, and the two runs must agree.

Run it with ``python docs/examples/train_ddp.py`` (2 local gloo ranks), or under a launcher:
``torchrun --nproc-per-node 2 docs/examples/train_ddp.py``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from communicator import Communicator, launch
from communicator.testing import run_single

SAMPLES = 512
TEST_SAMPLES = 130  # not a multiple of the world size: the sampler pads, collect_results drops it
GLOBAL_BATCH = 64
EPOCHS = 5
FEATURES = 8


def make_data() -> tuple[TensorDataset, TensorDataset]:
    """A fixed regression problem, the same in every process."""
    generator = torch.Generator().manual_seed(0)
    weights = torch.randn(FEATURES, 1, generator=generator)
    x = torch.randn(SAMPLES + TEST_SAMPLES, FEATURES, generator=generator)
    y = torch.sin(x @ weights) + 0.1 * torch.randn(SAMPLES + TEST_SAMPLES, 1, generator=generator)
    return TensorDataset(x[:SAMPLES], y[:SAMPLES]), TensorDataset(x[SAMPLES:], y[SAMPLES:])


def train(comm: Communicator, seed: int | None = None) -> dict[str, object] | None:
    """Train on ``comm``'s ranks; rank 0 returns the losses, the predictions and the seed."""
    seed = comm.sync_random_seed(seed)  # rank 0 draws it (or passes ``seed``); every rank gets it
    train_set, test_set = make_data()

    torch.manual_seed(seed)
    model: nn.Module = nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 1))
    if comm.is_distributed:
        # The communicator initialised torch's default group: DDP and other torch code just work.
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    # Each rank takes 1/world_size of every global batch, so a step sees the same samples as one
    # process with the whole batch.
    sampler = DistributedSampler(train_set, num_replicas=comm.world_size, rank=comm.rank, shuffle=True, seed=seed)
    loader = DataLoader(train_set, batch_size=GLOBAL_BATCH // comm.world_size, sampler=sampler)
    losses = []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        loss_sum, seen = torch.zeros((), dtype=torch.float64), 0
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach().double() * len(x)
            seen += len(x)
        totals = comm.all_reduce_dict({"loss_sum": loss_sum, "seen": seen})  # op="sum"
        losses.append((totals["loss_sum"] / totals["seen"]).item())

    # Evaluation: interleaved shards, as DistributedSampler hands them out (padded to equal size).
    test_sampler = DistributedSampler(test_set, num_replicas=comm.world_size, rank=comm.rank, shuffle=False)
    with torch.no_grad():
        part = [model(test_set[i][0][None]).item() for i in test_sampler]
    predictions = comm.collect_results(part, size=len(test_set))  # dataset order, padding dropped

    if not comm.is_main_process:
        return None
    return {"seed": seed, "losses": losses, "predictions": torch.tensor(predictions)}


def main(world_size: int = 2) -> dict[str, object]:
    # Under torchrun, srun or mpirun, create() finds the launcher and this process is one rank;
    # run as a plain script, it finds none, and launch() starts local ranks instead.
    with Communicator.create({"backend": "gloo"}) as comm:  # gloo: this small model stays on the CPU
        launched = comm.is_distributed
        result = train(comm) if launched else None
    if not launched:
        result = launch(train, world_size, {"backend": "gloo"})[0]
    if result is None:
        return {}  # a rank other than 0 under a launcher
    reference = run_single(train, result["seed"])  # the same function in one process, same seed

    loss, single_loss = result["losses"][-1], reference["losses"][-1]
    gap = max(abs(a - b) for a, b in zip(result["losses"], reference["losses"], strict=True))
    prediction_gap = (result["predictions"] - reference["predictions"]).abs().max().item()
    print(f"seed {result['seed']}: final loss {loss:.8f} on the ranks, {single_loss:.8f} in one process")
    print(
        f"largest loss difference over {EPOCHS} epochs: {gap:.2e}; largest prediction difference: {prediction_gap:.2e}"
    )
    assert abs(loss - single_loss) <= 1e-5 * max(1.0, abs(single_loss)), (loss, single_loss)
    assert prediction_gap <= 1e-4, prediction_gap
    assert len(result["predictions"]) == TEST_SAMPLES
    return {"loss": loss, "single_loss": single_loss, "loss_gap": gap, "prediction_gap": prediction_gap}


if __name__ == "__main__":
    main()
