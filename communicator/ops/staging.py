"""The staging that lets a backend work on any tensor (another device, a non-contiguous view, a
parameter, an inference tensor), the write-back of the result into the user's tensor, and the
memory that received tensors arrive in."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, TypeVar, cast

import torch

from communicator.control.waiting import PointToPoint, Together
from communicator.handles import Work

__all__ = ["editing", "empty", "homed", "stage", "while_editing", "write_back"]

T = TypeVar("T")

#: From this size up, new tensors to receive into get huge pages (see ``empty``), as NumPy's arrays do.
HUGE_PAGE_BYTES = 4 * 1024 * 1024


def _madvise() -> Callable[[int, int, int], int] | None:
    """libc's ``madvise`` where the kernel has transparent huge pages (Linux), else ``None``."""
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    try:
        advise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    advise.argtypes, advise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return advise


_advise = _madvise()


def stage(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` as the backend needs it: contiguous and on ``device`` (the tensor itself when it is)."""
    if tensor.is_cpu if device.type == "cpu" else tensor.device == device:
        if tensor.is_contiguous() and tensor.numel():
            return tensor
    else:
        with editing(tensor):
            return tensor.to(device).contiguous()
    if tensor.is_contiguous():
        # An empty tensor counts as contiguous whatever its strides, but a stride-0 one cannot be
        # viewed as bytes or as real parts: the backend gets an ordinary empty tensor.
        return torch.empty(tensor.shape, dtype=tensor.dtype, device=device)
    with editing(tensor):
        return tensor.contiguous()


def empty(shape: Sequence[int], dtype: torch.dtype, device: torch.device, fault_in: bool = False) -> torch.Tensor:
    """A new tensor to receive into; a large CPU one advised to use huge pages, and with
    ``fault_in``, touched page by page here, before a transfer writes into it.

    Left to fault in during a transfer, in the 4 KiB pages of a fresh ``torch.empty``, an
    all_gather or gather of 64 MiB tensors took 1.7 to 2.4 times as long (2 and 4 ranks on 2
    cores). A rank that sends while it receives (all_gather) touches its pages first: faulted in
    by gloo's receive, huge pages made that all_gather erratic, 1.4 to 3.4 times as slow in the
    median. A rank that only receives (a gather's destination) need not: its receive faulting
    them in overlaps the transfer (0.6 to 1.1 times the time of touching them first)."""
    tensor = torch.empty(shape, dtype=dtype, device=device)
    nbytes = tensor.numel() * tensor.element_size()
    if tensor.is_cpu and nbytes >= HUGE_PAGE_BYTES:
        if _advise is not None:  # advice only: a kernel without huge pages ignores it
            start = -(-tensor.data_ptr() // mmap.PAGESIZE) * mmap.PAGESIZE  # the whole pages inside it
            _advise(start, (tensor.data_ptr() + nbytes) // mmap.PAGESIZE * mmap.PAGESIZE - start, mmap.MADV_HUGEPAGE)
        if fault_in:
            tensor.view(-1).view(torch.uint8).numpy()[:: mmap.PAGESIZE] = 0
    return tensor


def editing(*tensors: torch.Tensor) -> contextlib.AbstractContextManager[Any]:
    """The mode in which the library may write into the user's tensors.

    Inference tensors can only be written in inference mode; parameters and other leaves that
    require grad only where autograd does not record (``no_grad``): torch's own collectives
    write into both without complaint, and so must the copies and divisions done around them.
    """
    if not torch.is_inference_mode_enabled() and any(t.is_inference() for t in tensors):
        return torch.inference_mode()
    return torch.no_grad()


def write_back(tensor: torch.Tensor, staged: torch.Tensor) -> None:
    """Copy a staged result into the user's tensor when the work was done on a copy."""
    if staged is not tensor:
        with editing(tensor, staged):
            if tensor.dtype == torch.bool and staged.device == tensor.device:  # bytes as reduced (True + True: 2)
                tensor.view(torch.uint8).copy_(staged.view(torch.uint8).reshape(tensor.shape))
            else:
                tensor.copy_(staged.reshape(tensor.shape))


def homed(finish: Callable[[], T], like: torch.Tensor, device: torch.device) -> Callable[[], T]:
    """``finish``, whose result (a tensor or a list of them) travelled on ``device`` (the
    communicator's), returning it on the device of ``like``, the tensor the caller passed: a CPU
    tensor under NCCL gets CPU results, as the in-place operations write back into it."""
    home = like.device
    if home == device:
        return finish

    def moved() -> T:
        result: Any = finish()
        if isinstance(result, torch.Tensor):
            return cast(T, result.to(home))
        return cast(T, [t.to(home) for t in result])

    return moved


class _Editing:
    """A work whose completion writes into ``tensor``: completed in the tensor's editing mode, in
    whichever thread waits (the mode is per thread; a transport may copy in at ``wait``)."""

    __slots__ = ("tensor", "work")

    def __init__(self, work: Any, tensor: torch.Tensor) -> None:
        self.work, self.tensor = work, tensor

    def wait(self, timeout: timedelta | None = None) -> Any:
        with editing(self.tensor):
            return self.work.wait() if timeout is None else self.work.wait(timeout)

    def is_completed(self) -> bool:
        return bool(self.work.is_completed())


def while_editing(work: Work, tensor: torch.Tensor) -> Work:
    """``work``, completed in ``tensor``'s editing mode when it needs one; the wrappers the control
    plane recognises (point-to-point, several works as one) stay outermost."""
    if not (tensor.requires_grad or tensor.is_inference()):
        return work
    if isinstance(work, PointToPoint):
        return PointToPoint(_Editing(work.work, tensor), work.peer, work.cut)
    if isinstance(work, Together):
        return Together([while_editing(part, tensor) for part in work.works])
    return _Editing(work, tensor)
