"""What DDP's own traffic gains through ``comm.as_process_group()``, on real gloo ranks: its
all-reduces are the communicator's operations (counted in ``comm.stats()``), a rank late for one
is named in the stall warning, and a rank killed in a step is ``PeerLostError`` on the survivor."""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from communicator import Communicator, PeerLostError, launch
from communicator.errors import RemoteFailure
from communicator.testing import run_ranks


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def _step(model: DistributedDataParallel, rank: int) -> None:
    model(torch.full((4, 8), float(rank + 1))).sum().backward()


def late_in_backward(comm: Communicator) -> dict[str, Any]:
    warnings = _Warnings()
    logging.getLogger("communicator").addHandler(warnings)
    model = DistributedDataParallel(_model(), process_group=comm.as_process_group())
    for step in range(3):
        if comm.rank == 1 and step == 1:
            time.sleep(5)  # a slow data loader: rank 0 waits in DDP's all-reduce meanwhile
        _step(model, comm.rank)
    return {"warnings": warnings.messages, "all_reduce calls": comm.stats()["all_reduce"].calls}


def test_ddp_traffic_is_counted_and_a_late_rank_is_named() -> None:
    results = run_ranks(late_in_backward, 2, cfg={"stall_seconds": 2, "stats": True, "timeout": 60}, timeout=90)
    for result in results:
        assert result["all_reduce calls"] >= 3  # one bucket a step at least, each the communicator's call
    named = [m for m in results[0]["warnings"] if "all_reduce" in m and "ranks [1] did not arrive" in m]
    assert len(named) == 1, results[0]["warnings"]


def killed_in_a_step(comm: Communicator) -> str:
    model = DistributedDataParallel(_model(), process_group=comm.as_process_group())
    _step(model, comm.rank)
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        _step(model, comm.rank)
    except PeerLostError as error:
        return f"PeerLostError naming {error.ranks}" if hasattr(error, "ranks") else "PeerLostError"
    return "no error"


def test_a_rank_killed_during_ddp_is_peer_lost_on_the_survivor() -> None:
    results = launch(killed_in_a_step, 2, {"timeout": 60}, timeout=90, on_failure="continue")
    assert isinstance(results[1], RemoteFailure) and "SIGKILL" in results[1].message
    assert results[0].startswith("PeerLostError"), results[0]
