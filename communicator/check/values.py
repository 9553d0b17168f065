"""What every rank must see in a check, computed from rank numbers alone, and how results compare."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from communicator.check.equality import same_value

__all__ = [
    "COMBINE",
    "REDUCE_INPUT",
    "Mismatch",
    "Skip",
    "arrive_late",
    "bits",
    "expect",
    "expect_same",
    "expect_tensor",
    "expect_tensors",
    "factors",
    "ints",
    "item",
    "payload",
    "ramp",
    "reduced",
    "short",
    "take_delay",
]


class Mismatch(Exception):
    """A result differs from the value it must have."""


class Skip(Exception):
    """The op does not apply to this communicator (e.g. point-to-point in a world of one)."""


def ramp(rank: int, n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Small whole numbers (exact in float32 sums), different on every rank."""
    return (torch.arange(n, dtype=torch.float64) % 251 + 1000 * rank).to(dtype)


def ints(rank: int, n: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return (torch.arange(n, dtype=torch.int64) * 7 + rank).to(dtype)


def factors(rank: int, n: int) -> torch.Tensor:
    """Ones and twos: any product over ranks is a power of two, exact in float32."""
    return 1 + ((torch.arange(n) + rank) % 2).to(torch.float32)


def bits(rank: int, n: int) -> torch.Tensor:
    """Low bits shared by every rank, one high bit per rank."""
    return (torch.arange(n, dtype=torch.int64) % 4) | (1 << (2 + rank % 60))


REDUCE_INPUT: dict[str, Callable[[int, int], torch.Tensor]] = {
    "sum": ramp,
    "mean": ramp,
    "product": factors,
    "min": ramp,
    "max": ramp,
    "band": bits,
    "bor": bits,
    "bxor": bits,
}
COMBINE: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "sum": torch.add,
    "mean": torch.add,
    "product": torch.mul,
    "min": torch.minimum,
    "max": torch.maximum,
    "band": torch.bitwise_and,
    "bor": torch.bitwise_or,
    "bxor": torch.bitwise_xor,
}


def reduced(op: str, values: Callable[[int], torch.Tensor], world: int) -> torch.Tensor:
    """``op`` applied across ``values(0) ... values(world - 1)``."""
    total = functools.reduce(COMBINE[op], (values(r) for r in range(world)))
    return total / world if op == "mean" else total


def payload(rank: int, n: int) -> dict[str, Any]:
    """An object with plain values, None, a NumPy array and a tensor."""
    return {
        "rank": rank,
        "name": f"rank-{rank}",
        "none": None,
        "pair": (rank, -rank),
        "array": np.arange(n, dtype=np.int64) + rank,
        "tensor": ramp(rank, n),
    }


def item(index: int, width: int) -> dict[str, Any] | None:
    """Result ``index`` of a data set; every fifth one is a real ``None``."""
    return None if index % 5 == 3 else {"index": index, "values": np.full(width, index, dtype=np.int32)}


# -- comparisons ----------------------------------------------------------------------------------


def short(value: object, limit: int = 80) -> str:
    text = repr(value).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise Mismatch(message)


def expect_tensor(got: object, want: torch.Tensor, what: str) -> None:
    if not isinstance(got, torch.Tensor):
        raise Mismatch(f"{what}: got {type(got).__name__}, expected a tensor")
    if got.dtype != want.dtype or got.shape != want.shape:
        raise Mismatch(f"{what}: got {got.dtype} {tuple(got.shape)}, expected {want.dtype} {tuple(want.shape)}")
    close = torch.isclose(got, want, rtol=1e-5, atol=1e-6) if want.is_floating_point() else got == want
    if not bool(close.all()):
        index = int((~close).flatten().nonzero()[0, 0])
        raise Mismatch(
            f"{what}: element {index} is {got.flatten()[index].item()}, expected {want.flatten()[index].item()}"
        )


def expect_tensors(got: object, want: Sequence[torch.Tensor], what: str) -> None:
    if not isinstance(got, list) or len(got) != len(want):
        raise Mismatch(f"{what}: got {short(got)}, expected a list of {len(want)} tensors")
    for index, (mine, theirs) in enumerate(zip(got, want, strict=True)):
        expect_tensor(mine, theirs, f"{what}[{index}]")


def expect_same(got: object, want: object, what: str) -> None:
    expect(same_value(got, want), f"{what}: got {short(got)}, expected {short(want)}")


# Per thread: ranks may be threads of one process (a thread-backed communicator).
_delays = threading.local()


def arrive_late(seconds: float) -> None:
    """Sleep on purpose before an op; the runner leaves the time slept out of the op's time."""
    start = time.perf_counter()
    time.sleep(seconds)
    _delays.slept = getattr(_delays, "slept", 0.0) + time.perf_counter() - start
    _delays.asked = getattr(_delays, "asked", 0.0) + seconds


def take_delay() -> tuple[float, float]:
    """(seconds slept, seconds asked for) in :func:`arrive_late` by this thread since the last
    call, and start again from 0: the time slept leaves the op's time, the delay asked is reported
    (a loaded machine oversleeps)."""
    slept: float = getattr(_delays, "slept", 0.0)
    asked: float = getattr(_delays, "asked", 0.0)
    _delays.slept = _delays.asked = 0.0
    return slept, asked
