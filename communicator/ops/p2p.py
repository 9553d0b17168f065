"""Point to point (a mixin of ``Communicator``): ``isend``/``irecv`` over the primitives
``_isend``/``_irecv``, and the blocking ``send``/``recv`` over them."""

from __future__ import annotations

import torch

from communicator.arguments import check_output, check_peer, check_tag, check_tensor
from communicator.config import Timeout
from communicator.guard import collective
from communicator.handles import Handle
from communicator.ops.staging import write_back
from communicator.ops.tensors import TensorHost

__all__ = ["PointToPoint"]

Tensor = torch.Tensor


class PointToPoint:
    """The operations between two ranks."""

    @collective(p2p=True)
    def isend(
        self: TensorHost, tensor: Tensor, dst: int, tag: int = 0, *, timeout: Timeout | None = None
    ) -> Handle[None]:
        """Start sending ``tensor`` to rank ``dst``; ``wait()`` the handle before reusing the tensor."""
        tensor = check_tensor("tensor", tensor)
        dst, tag = check_peer("dst", dst, self.rank, self.world_size), check_tag(tag)
        work = self._start(self._isend, self._stage(tensor).detach(), dst, tag)
        self._calls.count(tensor.nbytes, 0, tensor.nbytes)
        return Handle([work], lambda: None, self._wait, self._calls.timeout)

    @collective(p2p=True)
    def irecv(
        self: TensorHost, tensor: Tensor, src: int, tag: int = 0, *, timeout: Timeout | None = None
    ) -> Handle[Tensor]:
        """Start receiving into ``tensor`` from rank ``src``; ``wait()`` returns the filled tensor."""
        tensor = check_output("tensor", tensor)
        src, tag = check_peer("src", src, self.rank, self.world_size), check_tag(tag)
        staged = self._stage(tensor)
        work = self._start_into(staged, self._irecv, src, tag)
        self._calls.count(0, tensor.nbytes, tensor.nbytes)

        def finish() -> torch.Tensor:
            write_back(tensor, staged)
            return tensor

        return Handle([work], finish, self._wait, self._calls.timeout)

    @collective(p2p=True)
    def send(self: TensorHost, tensor: torch.Tensor, dst: int, tag: int = 0, *, timeout: Timeout | None = None) -> None:
        """Send ``tensor`` to rank ``dst`` (blocking). The receiver needs the same shape and dtype."""
        self.isend(tensor, dst, tag).wait()

    @collective(p2p=True)
    def recv(
        self: TensorHost, tensor: torch.Tensor, src: int, tag: int = 0, *, timeout: Timeout | None = None
    ) -> torch.Tensor:
        """Receive into ``tensor`` from rank ``src`` (blocking) and return it."""
        return self.irecv(tensor, src, tag).wait()
