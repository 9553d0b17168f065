"""`all_reduce_dict`: reduce a (nested) dict of tensors and numbers with as few collectives as possible.

Every rank sends one fixed-size record holding a digest of its keys, shapes and dtypes and, when the
values are small, the values themselves: small dicts need that one collective and are reduced
locally, in the same order on every rank. Larger dicts need one more collective per dtype and
device. Differing digests raise the same :class:`CollectiveMismatchError` on every rank.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from communicator.errors import CollectiveMismatchError
from communicator.reductions import ReduceOpLike, check_op_dtype, is_floating, parse_op

if TYPE_CHECKING:
    from communicator.objects.channel import Channel


class Reducer(Protocol):
    """What the reduction needs of a communicator: its size, a tensor all-reduce, an object all-gather."""

    @property
    def world_size(self) -> int: ...

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOpLike = "sum") -> Any: ...

    def all_gather_object(self, obj: Any) -> list[Any]: ...


__all__ = ["all_reduce_dict"]

DIGEST_BYTES = 8192
_HEAD = struct.Struct("<16sBxxxxxxxQ")  # digest, values inline?, values' byte count
_ALIGN = 16

Path = tuple[Any, ...]


class _Leaf:
    """One value of the dict: where it is, what it was, and the tensor that carries it."""

    __slots__ = ("key", "kind", "original", "path", "tensor")

    def __init__(self, path: Path, kind: str, tensor: torch.Tensor, original: Any) -> None:
        self.path = path
        self.kind = kind  # "tensor", "int", "float", "bool", "numpy"
        self.tensor = tensor
        self.original = original
        self.key = repr(path)  # the order and the name ranks compare


def _leaves(data: Mapping[Any, Any], prefix: Path = ()) -> list[tuple[Path, Any]]:
    found: list[tuple[Path, Any]] = []
    for key, value in data.items():
        if type(value) is not torch.Tensor and isinstance(value, Mapping):  # a tensor first: no ABC check
            found.extend(_leaves(value, (*prefix, key)))
        else:
            found.append(((*prefix, key), value))
    return found


def _leaf(path: Path, value: Any) -> _Leaf:
    if type(value) is torch.Tensor:  # the common case first
        return _Leaf(path, "tensor", value.detach(), value)
    if isinstance(value, torch.Tensor):
        return _Leaf(path, "tensor", value.detach(), value)
    if isinstance(value, bool):
        return _Leaf(path, "bool", torch.tensor(value), value)
    if isinstance(value, int):
        return _Leaf(path, "int", torch.tensor(value, dtype=torch.int64), value)
    if isinstance(value, float):
        return _Leaf(path, "float", torch.tensor(value, dtype=torch.float64), value)
    if isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in "biufc":
        return _Leaf(path, "numpy", torch.from_numpy(np.array(value, copy=True)), value)
    name = ".".join(map(str, path))
    raise TypeError(f"all_reduce_dict: value at {name!r} is a {type(value).__name__}; expected a tensor or a number")


_DTYPE_NAMES: dict[torch.dtype, str] = {}


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype)
    return name


def _signature(leaves: list[_Leaf]) -> list[tuple[str, str, tuple[int, ...], str]]:
    return [
        (leaf.key, _dtype_name(leaf.tensor.dtype), tuple(leaf.tensor.shape), leaf.tensor.device.type) for leaf in leaves
    ]


def _mismatch(signatures: list[list[tuple[str, str, tuple[int, ...], str]]]) -> CollectiveMismatchError:
    everyone = [dict((k, rest) for k, *rest in sig) for sig in signatures]
    all_keys = set().union(*everyone)
    sides = {}
    for rank, mine in enumerate(everyone):
        missing = sorted(all_keys - mine.keys())
        differing = sorted(k for k in mine if any(k in other and other[k] != mine[k] for other in everyone))
        parts = []
        if missing:
            parts.append(f"missing keys {', '.join(missing)}")
        if differing:
            parts.append("; ".join(f"{k}: dtype {mine[k][0]}, shape {mine[k][1]}, {mine[k][2]}" for k in differing))
        sides[rank] = ", ".join(parts) or "as expected"
    return CollectiveMismatchError(sides, "all_reduce_dict: keys, shapes or dtypes differ")


def _reduce_local(name: str, stacked: torch.Tensor, world: int) -> torch.Tensor:
    dtype = stacked.dtype
    if dtype == torch.bool:
        if name == "mean":
            return stacked.double().mean(0)
        if name in ("sum", "max", "bor"):
            return stacked.any(0)
        if name == "bxor":
            return stacked.sum(0) % 2 == 1
        return stacked.all(0)
    if name == "sum":
        return stacked.sum(0, dtype=dtype)
    if name == "mean":
        return stacked.sum(0, dtype=dtype) / world if is_floating(dtype) else stacked.double().sum(0) / world
    if name == "product":
        return stacked.prod(0).to(dtype)
    if name == "min":
        return stacked.amin(0)
    if name == "max":
        return stacked.amax(0)
    fn = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}[name]
    return functools.reduce(fn, stacked.unbind(0))


def _restore(leaf: _Leaf, value: torch.Tensor) -> Any:
    if leaf.kind == "tensor":
        return value.to(leaf.tensor.device)
    if leaf.kind == "numpy":
        array = value.numpy()
        return array if isinstance(leaf.original, np.ndarray) else array[()]
    item = value.item()
    return item if leaf.kind != "bool" or isinstance(item, float) else bool(item)


def _nest(pairs: list[tuple[Path, Any]], template: Mapping[Any, Any]) -> dict[Any, Any]:
    values = dict(pairs)

    def build(node: Mapping[Any, Any], prefix: Path) -> dict[Any, Any]:
        return {
            key: build(value, (*prefix, key))
            if type(value) is not torch.Tensor and isinstance(value, Mapping)
            else values[(*prefix, key)]
            for key, value in node.items()
        }

    return build(template, ())


def all_reduce_dict(
    comm: Reducer,
    channel: Channel,
    data: Mapping[Any, Any],
    op: ReduceOpLike,
    count: Callable[[int, int, int], None],
) -> dict[Any, Any]:
    """``data`` reduced across ``comm``'s ranks; ``channel`` carries the records (see the module docstring).

    ``count(sent, received, size)`` is told the bytes of values that travel inline, as an
    ``all_reduce`` of them would count them (larger buckets count in their ``all_reduce``).
    """
    name = parse_op(op)
    if not isinstance(data, Mapping):
        raise TypeError(f"all_reduce_dict needs a dict, got {type(data).__name__}")
    leaves = sorted((_leaf(p, v) for p, v in _leaves(data)), key=_key)
    signature = _signature(leaves)
    digest = hashlib.blake2b(repr(signature).encode(), digest_size=16).digest()
    buckets = _buckets(leaves)
    for _, dtype in buckets:
        check_op_dtype(name, dtype)

    # Each bucket's values, flattened into one tensor, at an aligned offset of the record.
    flats, offsets, end = [], [], 0
    for members in buckets.values():
        flat = _flatten([m.tensor for m in members])
        flats.append(flat)
        offsets.append(end)
        end = -(-(end + flat.numel() * flat.element_size()) // _ALIGN) * _ALIGN
    inline = end <= DIGEST_BYTES - _HEAD.size
    record = np.zeros(DIGEST_BYTES, dtype=np.uint8)
    _HEAD.pack_into(record.data, 0, digest, int(inline), end)
    if inline:
        for flat, offset in zip(flats, offsets, strict=True):
            raw = flat.cpu().view(torch.uint8).numpy()
            record[_HEAD.size + offset : _HEAD.size + offset + raw.size] = raw

    rows = channel.all_gather(record)
    if any(bytes(row[:16]) != digest for row in rows):
        raise _mismatch(comm.all_gather_object(signature))
    if inline:
        values = sum(flat.numel() * flat.element_size() for flat in flats)
        count(values, values, values)

    world = comm.world_size
    reduced: list[tuple[Path, Any]] = []
    for members, flat, offset in zip(buckets.values(), flats, offsets, strict=True):
        if inline:  # every rank reduces the same rows in the same order: bitwise the same answer
            start = _HEAD.size + offset
            stop = start + flat.numel() * flat.element_size()
            stacked = torch.stack([torch.from_numpy(row[start:stop]).view(flat.dtype) for row in rows])
            result = _reduce_local(name, stacked, world)
        else:
            result = _reduce_bucket(comm, flat, name)
        pieces = _unflatten(result, [m.tensor for m in members])
        reduced.extend((member.path, _restore(member, piece)) for member, piece in zip(members, pieces, strict=True))
    return _nest(reduced, data)


def _flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One new 1-D tensor holding every tensor's values, in order."""
    if all(t.dim() == 0 for t in tensors):
        return torch.stack(tensors)  # metrics are mostly scalars: one call instead of one per value
    return torch.cat([t.reshape(-1) for t in tensors])


def _unflatten(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """``flat`` cut back into tensors shaped like ``like``."""
    if all(t.dim() == 0 for t in like):
        return list(flat.unbind(0))
    return [piece.reshape(t.shape) for piece, t in zip(torch.split(flat, [t.numel() for t in like]), like, strict=True)]


def _key(leaf: _Leaf) -> str:
    return leaf.key


def _buckets(leaves: list[_Leaf]) -> dict[tuple[torch.device, torch.dtype], list[_Leaf]]:
    """Leaves grouped by device and dtype, in the (sorted) order of their first leaf."""
    buckets: dict[tuple[torch.device, torch.dtype], list[_Leaf]] = {}
    for leaf in leaves:
        tensor = leaf.tensor
        buckets.setdefault((tensor.device, tensor.dtype), []).append(leaf)
    return buckets


def _reduce_bucket(comm: Reducer, flat: torch.Tensor, name: str) -> torch.Tensor:
    """One collective for a bucket too large to travel inline."""
    integer_mean = name == "mean" and not is_floating(flat.dtype)
    flat = flat.double() if integer_mean else flat  # already a fresh tensor (torch.cat)
    comm.all_reduce(flat, op="sum" if integer_mean else name)
    return flat / comm.world_size if integer_mean else flat
