"""The transport hears once that an operation was abandoned (``_abandoned``), so that it can release
what is still in flight: ``TorchComm`` aborts an NCCL group there (a GPU machine is needed to see
that; this checks the hook on gloo)."""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from communicator import Communicator, RemoteError, TorchComm


@Communicator.register("abandon-recording")
class Recording(TorchComm):
    abandoned: list[str] = []  # noqa: RUF012 - one process, one communicator

    @override
    def _abandoned(self, cause: BaseException) -> None:
        Recording.abandoned.append(type(cause).__name__)
        super()._abandoned(cause)


def fails_in_step(comm: Communicator) -> dict[str, Any]:
    try:
        with comm.fail_together("step"):
            if comm.rank == 1:
                raise ValueError("a corrupt batch")
            comm.all_reduce(torch.ones(1))
    except (RemoteError, ValueError) as error:
        caught = type(error).__name__
    return {"caught": caught, "abandoned": list(Recording.abandoned), "class": type(comm).__name__}


def test_an_abandoned_operation_reaches_the_transport_once() -> None:
    from communicator.testing import run_ranks

    results = run_ranks(fails_in_step, 2, cfg={"type": "abandon-recording", "timeout": 60}, timeout=90)
    assert results[0]["class"] == "Recording" and results[0]["caught"] == "RemoteError"
    assert len(results[0]["abandoned"]) == 1, results[0]  # rank 0 was released from its all_reduce
