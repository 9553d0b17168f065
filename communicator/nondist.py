"""`NonDistComm`: the communicator of a single process. Every collective is the identity."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar

import numpy as np
import torch
from typing_extensions import override

from communicator.base import Communicator, check_split_arguments
from communicator.config import CommConfig
from communicator.guard import collective
from communicator.handles import Handle
from communicator.ops import ReduceOpLike, check_op_dtype, parse_op
from communicator.results import check_arguments, merge_parts

__all__ = ["NonDistComm"]

T = TypeVar("T")


class NonDistComm(Communicator):
    """A world of one: rank 0 of 1, no ``torch.distributed`` needed.

    Arguments are checked exactly as a distributed communicator checks them (a bad op or an
    out-of-range rank raises the same error), and results have the same types, so code tested
    with it behaves the same under a launcher. Object methods return their input without
    serialising it.
    """

    def __init__(self, config: CommConfig | None = None, reason: str = "") -> None:
        super().__init__(config)
        self._reason = reason
        self._device = torch.device(self.config.device or "cpu")

    @property
    @override
    def rank(self) -> int:
        return 0

    @property
    @override
    def world_size(self) -> int:
        return 1

    @property
    @override
    def local_rank(self) -> int:
        return 0

    @property
    @override
    def local_size(self) -> int:
        return 1

    @property
    @override
    def node_rank(self) -> int:
        return 0

    @property
    @override
    def num_nodes(self) -> int:
        return 1

    @property
    @override
    def backend(self) -> str:
        return "none"

    @property
    @override
    def device(self) -> torch.device:
        return self._device

    @property
    @override
    def is_distributed(self) -> bool:
        return False

    @property
    @override
    def global_ranks(self) -> tuple[int, ...]:
        return (0,)

    # -- tensor collectives: the identity, after the same checks --------------------------

    @staticmethod
    def _tensor(name: str, tensor: object) -> torch.Tensor:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        return tensor

    @staticmethod
    def _result(value: T, async_op: bool) -> Any:
        return Handle.done(value) if async_op else value

    def _tensors(self, name: str, tensors: object) -> list[torch.Tensor]:
        if isinstance(tensors, torch.Tensor) or not isinstance(tensors, Sequence) or len(tensors) != 1:
            raise ValueError(f"{name} needs a sequence of {self.world_size} tensors (one per rank)")
        return [self._tensor(f"{name}[0]", tensors[0])]

    @override
    @collective()
    def barrier(self, timeout: float | None = None) -> None:
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
            raise ValueError(f"barrier timeout must be a positive number of seconds, got {timeout!r}")

    @override
    @collective()
    def all_reduce(self, tensor: torch.Tensor, op: ReduceOpLike = "sum", async_op: bool = False) -> Any:
        check_op_dtype(parse_op(op), self._tensor("tensor", tensor).dtype)
        return self._result(tensor, async_op)

    @override
    @collective()
    def all_gather(self, tensor: torch.Tensor, async_op: bool = False) -> Any:
        return self._result([self._tensor("tensor", tensor).clone()], async_op)

    @override
    @collective()
    def gather(self, tensor: torch.Tensor, dst: int = 0, async_op: bool = False) -> Any:
        self._check_rank("dst", dst)
        return self._result([self._tensor("tensor", tensor).clone()], async_op)

    @override
    @collective()
    def broadcast(self, tensor: torch.Tensor, src: int = 0, async_op: bool = False) -> Any:
        self._check_rank("src", src)
        return self._result(self._tensor("tensor", tensor), async_op)

    @override
    @collective()
    def reduce(self, tensor: torch.Tensor, dst: int = 0, op: ReduceOpLike = "sum", async_op: bool = False) -> Any:
        self._check_rank("dst", dst)
        check_op_dtype(parse_op(op), self._tensor("tensor", tensor).dtype)
        return self._result(tensor, async_op)

    @override
    @collective()
    def scatter(self, tensors: Sequence[torch.Tensor] | None, src: int = 0, async_op: bool = False) -> Any:
        self._check_rank("src", src)
        return self._result(self._tensors("scatter", tensors)[0].clone(), async_op)

    @override
    @collective()
    def reduce_scatter(self, tensors: Sequence[torch.Tensor], op: ReduceOpLike = "sum", async_op: bool = False) -> Any:
        (tensor,) = self._tensors("reduce_scatter", tensors)
        check_op_dtype(parse_op(op), tensor.dtype)
        return self._result(tensor.clone(), async_op)

    @override
    @collective()
    def all_to_all(self, tensors: Sequence[torch.Tensor], async_op: bool = False) -> Any:
        return self._result([t.clone() for t in self._tensors("all_to_all", tensors)], async_op)

    def _no_peer(self, name: str, peer: int) -> None:
        self._check_rank(name, peer)
        raise ValueError(f"{name}={peer} is this rank; a single process has no peer to talk to")

    @override
    @collective()
    def send(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> None:
        self._no_peer("dst", dst)

    @override
    @collective()
    def recv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> torch.Tensor:
        self._no_peer("src", src)
        return tensor

    @override
    @collective()
    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> Handle[None]:
        self._no_peer("dst", dst)
        return Handle.done(None)

    @override
    @collective()
    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> Handle[torch.Tensor]:
        self._no_peer("src", src)
        return Handle.done(tensor)

    # -- groups: a world of one splits into itself ------------------------------------------------

    @override
    @collective()
    def new_group(self, ranks: Sequence[int]) -> Communicator:
        if isinstance(ranks, (str, bytes)) or not isinstance(ranks, Sequence) or len(ranks) != 1:
            raise TypeError(f"ranks must be a non-empty sequence of ranks of this communicator, got {ranks!r}")
        self._check_rank("ranks[0]", ranks[0])
        return NonDistComm(self.config, reason="a subgroup of a single process")

    @override
    @collective()
    def split(self, color: int | None, key: int | None = None) -> Communicator:
        check_split_arguments(color, key)
        return NonDistComm(self.config, reason="a split of a single process")

    @property
    @override
    def local_comm(self) -> Communicator:
        return self

    # -- raw primitives: a world of one exchanges with itself ------------------------------

    @override
    def _gather_records(self, record: np.ndarray) -> list[np.ndarray]:
        return [record]

    @override
    def _broadcast_record(self, record: np.ndarray, src: int) -> np.ndarray:
        return record

    @override
    def _scatter_records(self, records: Sequence[np.ndarray] | None, src: int) -> np.ndarray:
        assert records is not None
        return records[0]

    @override
    def _exchange(self, sends: Mapping[int, np.ndarray], recvs: Mapping[int, np.ndarray]) -> None:
        if sends or recvs:
            raise ValueError("a single process has no peer to exchange bytes with")

    # -- object methods: no serialisation -----------------------------------------------------

    @override
    @collective()
    def all_gather_object(self, obj: T) -> list[T]:
        return [obj]

    @override
    @collective()
    def gather_object(self, obj: T, dst: int = 0) -> list[T] | None:
        self._check_rank("dst", dst)
        return [obj]

    @override
    @collective()
    def broadcast_object(self, obj: T, src: int = 0) -> T:
        self._check_rank("src", src)
        return obj

    @override
    @collective()
    def broadcast_object_list(self, objects: list[Any], src: int = 0) -> list[Any]:
        if not isinstance(objects, list):
            raise TypeError(f"broadcast_object_list needs a list, got {type(objects).__name__}")
        self._check_rank("src", src)
        return objects

    @override
    @collective()
    def scatter_object(self, objects: Sequence[T] | None, src: int = 0) -> T:
        self._check_rank("src", src)
        if objects is None or isinstance(objects, (str, bytes)) or len(objects) != 1:
            raise ValueError("scatter_object: src must pass a sequence of 1 object (one per rank)")
        return objects[0]

    @override
    @collective()
    def send_object(self, obj: Any, dst: int) -> None:
        self._no_peer("dst", dst)

    @override
    @collective()
    def recv_object(self, src: int) -> Any:
        self._no_peer("src", src)

    @override
    @collective()
    def collect_results(
        self,
        results: Sequence[T],
        size: int,
        *,
        dst: int = 0,
        order: Literal["interleave", "contiguous"] = "interleave",
        device: str = "cpu",
    ) -> list[T] | None:
        check_arguments(results, size, order, device)
        self._check_rank("dst", dst)
        return merge_parts([results], size, order)
