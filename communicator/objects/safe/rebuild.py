"""Values rebuilt from plain data: raw bytes, a dtype named from a fixed list, a shape, numbers, strings.

The default codec sends CPU/CUDA tensors this way. The ``"safe"`` codec sends every NumPy and
torch value, complex number, date, path and ``collections`` container this way, so a receiver
never runs NumPy's or torch's own reconstruction code, which trusts its input. Every function here
checks its arguments before building anything and raises ``pickle.UnpicklingError`` naming what is
wrong; :func:`allocation` bounds what each call allocates, before it is made.
"""

from __future__ import annotations

import collections
import contextvars
import datetime as dt
import pathlib
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from communicator.reductions import WIRE_DTYPES

__all__ = [
    "FACTORIES",
    "NUMPY_DTYPES",
    "NUMPY_SCALAR_TYPES",
    "REBUILDERS",
    "TORCH_DTYPES",
    "NotRebuildable",
    "allocation",
    "receive_device",
    "reduce_tensor",
    "safe_reduction",
]

#: The device that CUDA tensors inside received objects are moved to (``None``: stay on the CPU).
receive_device: contextvars.ContextVar[torch.device | None] = contextvars.ContextVar("receive_device", default=None)

MAX_DIMS = 32
_PLAIN_NUMPY: tuple[str, ...] = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_PLAIN_NUMPY += ("float16", "float32", "float64", "complex64", "complex128")
#: Plain NumPy dtypes by their ``dtype.str`` (``"<f4"``, ``">i8"``, ``"|b1"``), in both byte orders.
NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
    kind.str: kind for name in _PLAIN_NUMPY for kind in (np.dtype(name), np.dtype(name).newbyteorder())
}
#: The scalar types of the plain dtypes (``np.float32``, ...), which may travel as values.
NUMPY_SCALAR_TYPES: tuple[type[np.generic], ...] = tuple(np.dtype(name).type for name in _PLAIN_NUMPY)
#: Tensor dtypes by ``str(dtype)`` (``"torch.float32"``): those the library moves as raw bytes.
TORCH_DTYPES: dict[str, torch.dtype] = {str(kind): kind for kind in WIRE_DTYPES}
#: What a ``defaultdict`` may call for a missing key: builtin types, which allocate nothing from data.
FACTORIES: tuple[type, ...] = (list, dict, set, frozenset, tuple, int, float, complex, str, bytes, bytearray, bool)
_PATHS = {cls.__name__: cls for cls in (pathlib.PurePosixPath, pathlib.PureWindowsPath, pathlib.PosixPath)}
_PATHS["WindowsPath"] = pathlib.WindowsPath
_MAX_ELEMENTS = 2**62  # more elements than this overflow byte strides, even in an empty array


class NotRebuildable(ValueError):
    """A value of a supported type that cannot be rebuilt from plain data (an object array, ...)."""


def _bad(what: str) -> pickle.UnpicklingError:
    return pickle.UnpicklingError(what)


def _exact(value: Any, kind: type, name: str) -> Any:
    if type(value) is not kind:
        raise _bad(f"{name} must be a {kind.__name__}, got {type(value).__name__}")
    return value


def _optional_int(value: Any, name: str) -> int | None:
    return None if value is None else _exact(value, int, name)


def _raw(value: Any) -> memoryview:
    if type(value) not in (bytes, bytearray, memoryview):
        raise _bad(f"data must be bytes or an out-of-band buffer, got {type(value).__name__}")
    view = memoryview(value)
    if not view.c_contiguous:
        raise _bad("data must be a contiguous buffer")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _shape(value: Any, itemsize: int, nbytes: int) -> tuple[int, ...]:
    """A shape that describes exactly ``nbytes`` bytes of ``itemsize``-byte elements."""
    dims: tuple[int, ...] = _exact(value, tuple, "shape")
    if len(dims) > MAX_DIMS:
        raise _bad(f"shape {dims!r} has more than {MAX_DIMS} dimensions")
    count = nonzero = 1
    for dim in dims:
        if type(dim) is not int or dim < 0:
            raise _bad(f"shape {dims!r} must hold non-negative ints")
        count *= dim
        nonzero *= dim or 1
        if nonzero > _MAX_ELEMENTS // itemsize:
            raise _bad(f"shape {dims!r} is too large")
    if count * itemsize != nbytes:
        raise _bad(f"shape {dims!r} needs {count * itemsize} bytes, the data has {nbytes}")
    return dims


def _numpy_dtype(name: Any) -> np.dtype[Any]:
    kind = NUMPY_DTYPES.get(name) if type(name) is str else None
    if kind is None:
        raise _bad(f"dtype {name!r} is not a plain NumPy dtype ({', '.join(_PLAIN_NUMPY)})")
    return kind


def _check_bools(view: memoryview) -> None:
    # Bytes other than 0 and 1 make inconsistent bools (NumPy and torch assume 0 or 1).
    if view.nbytes and np.frombuffer(view, dtype=np.uint8).max() > 1:
        raise _bad("bool data must hold only the bytes 0 and 1")


def ndarray(data: Any, dtype: Any, shape: Any, fortran: Any) -> np.ndarray:
    """A NumPy array viewing ``data`` (no copy): a plain dtype, a shape, C or Fortran order."""
    kind, view = _numpy_dtype(dtype), _raw(data)
    dims = _shape(shape, kind.itemsize, view.nbytes)
    fortran_order = _exact(fortran, bool, "fortran")
    if kind.kind == "b":
        _check_bools(view)
    flat = np.frombuffer(view, dtype=kind) if view.nbytes else np.empty(0, dtype=kind)
    return flat.reshape(dims, order="F" if fortran_order else "C")


def numpy_scalar(dtype: Any, data: Any) -> np.generic:
    """A NumPy scalar (``np.float32(1.5)``) from its dtype and its bytes."""
    kind, view = _numpy_dtype(dtype), _raw(data)
    if view.nbytes != kind.itemsize:
        raise _bad(f"a {kind} scalar needs {kind.itemsize} bytes, the data has {view.nbytes}")
    if kind.kind == "b":
        _check_bools(view)
    value: np.generic = np.frombuffer(view, dtype=kind)[0]
    return value


def numpy_dtype(dtype: Any) -> np.dtype[Any]:
    """A plain NumPy dtype, by its ``dtype.str``."""
    return _numpy_dtype(dtype)


def tensor(data: Any, dtype: Any, shape: Any, requires_grad: Any, was_cuda: Any, parameter: Any) -> torch.Tensor:
    """A tensor viewing ``data`` (no copy, unless it moves to this rank's GPU)."""
    kind = TORCH_DTYPES.get(dtype) if type(dtype) is str else None
    if kind is None:
        raise _bad(f"tensor dtype {dtype!r} is not one of {', '.join(TORCH_DTYPES)}")
    view = _raw(data)
    dims = _shape(shape, kind.itemsize, view.nbytes)
    grad, cuda = _exact(requires_grad, bool, "requires_grad"), _exact(was_cuda, bool, "was_cuda")
    as_parameter = _exact(parameter, bool, "parameter")
    if grad and not (kind.is_floating_point or kind.is_complex):
        raise _bad(f"a {kind} tensor cannot require gradients")
    if kind == torch.bool:
        _check_bools(view)
    if view.nbytes == 0:
        result = torch.empty(dims, dtype=kind)
    else:
        # torch ignores read-only flags: a tensor must not be able to write into immutable bytes.
        writable = memoryview(bytearray(view)) if view.readonly else view
        result = torch.frombuffer(writable, dtype=torch.uint8).view(kind).reshape(dims)
    device = receive_device.get()
    if cuda and device is not None:
        result = result.to(device)
    if as_parameter:
        return torch.nn.Parameter(result, requires_grad=grad)
    return result.requires_grad_(True) if grad else result


def torch_size(dims: Any) -> torch.Size:
    """A ``torch.Size`` from a tuple of ints."""
    if type(dims) is not tuple or any(type(d) is not int for d in dims):
        raise _bad(f"torch.Size needs a tuple of ints, got {dims!r}")
    return torch.Size(dims)


def torch_device(kind: Any, index: Any) -> torch.device:
    """A ``torch.device`` from its type and index."""
    name, number = _exact(kind, str, "device type"), _optional_int(index, "device index")
    return torch.device(name) if number is None else torch.device(name, number)


def complex_number(real: Any, imag: Any) -> complex:
    """A complex number from two floats."""
    return complex(_exact(real, float, "real part"), _exact(imag, float, "imaginary part"))


def _tzinfo(value: Any) -> dt.tzinfo | None:
    if value is not None and not isinstance(value, dt.tzinfo):
        raise _bad(f"tzinfo must be None or a tzinfo, got {type(value).__name__}")
    return value


def _ints(values: tuple[Any, ...], names: str) -> list[int]:
    return [_exact(value, int, name) for value, name in zip(values, names.split(), strict=True)]


def date(year: Any, month: Any, day: Any) -> dt.date:
    """A ``datetime.date`` (the constructor checks the ranges)."""
    return dt.date(*_ints((year, month, day), "year month day"))


def time(hour: Any, minute: Any, second: Any, microsecond: Any, tzinfo: Any, fold: Any) -> dt.time:
    """A ``datetime.time``."""
    h, m, s, us, f = _ints((hour, minute, second, microsecond, fold), "hour minute second microsecond fold")
    return dt.time(h, m, s, us, _tzinfo(tzinfo), fold=f)


def datetime(year: Any, month: Any, day: Any, hour: Any, minute: Any, second: Any, microsecond: Any, tzinfo: Any,
             fold: Any) -> dt.datetime:  # fmt: skip
    """A ``datetime.datetime``."""
    y, mo, d, h, mi, s, us, f = _ints((year, month, day, hour, minute, second, microsecond, fold), "y mo d h mi s us f")
    return dt.datetime(y, mo, d, h, mi, s, us, _tzinfo(tzinfo), fold=f)


def timedelta(days: Any, seconds: Any, microseconds: Any) -> dt.timedelta:
    """A ``datetime.timedelta``."""
    return dt.timedelta(*_ints((days, seconds, microseconds), "days seconds microseconds"))


def timezone(offset: Any, name: Any) -> dt.timezone:
    """A fixed-offset ``datetime.timezone``."""
    delta = _exact(offset, dt.timedelta, "offset")
    return dt.timezone(delta) if name is None else dt.timezone(delta, _exact(name, str, "name"))


def path(kind: Any, text: Any) -> pathlib.PurePath:
    """A ``pathlib`` path rebuilt from its string alone, so its parts agree with its string."""
    cls = _PATHS.get(kind) if type(kind) is str else None
    if cls is None:
        raise _bad(f"path type {kind!r} is not one of {', '.join(_PATHS)}")
    result: pathlib.PurePath = cls(_exact(text, str, "path"))
    return result


def ordered_dict(items: Any) -> collections.OrderedDict[Any, Any]:
    """An ``OrderedDict`` from a dict (which keeps the order)."""
    return collections.OrderedDict(_exact(items, dict, "items"))


def default_dict(factory: Any, items: Any) -> collections.defaultdict[Any, Any]:
    """A ``defaultdict`` whose factory is ``None`` or a builtin type."""
    if factory is not None and not any(factory is allowed for allowed in FACTORIES):
        raise _bad(f"a defaultdict factory must be None or one of {', '.join(f.__name__ for f in FACTORIES)}")
    return collections.defaultdict(factory, _exact(items, dict, "items"))


def counter(items: Any) -> collections.Counter[Any]:
    """A ``Counter`` from a dict of counts."""
    return collections.Counter(_exact(items, dict, "items"))


def deque(items: Any, maxlen: Any) -> collections.deque[Any]:
    """A ``deque`` from a list and its ``maxlen``."""
    limit = _optional_int(maxlen, "maxlen")
    if limit is not None and limit < 0:
        raise _bad(f"maxlen must be None or non-negative, got {limit}")
    return collections.deque(_exact(items, list, "items"), limit)


#: Every function above: what a ``"safe"`` payload may call, by name in this module.
REBUILDERS: tuple[Callable[..., Any], ...] = (
    ndarray, numpy_scalar, numpy_dtype, tensor, torch_size, torch_device, complex_number, date, time,
    datetime, timedelta, timezone, path, ordered_dict, default_dict, counter, deque,
)  # fmt: skip

_CALL_BYTES = 512  # a result's header: an array, a tensor, a date, a small container


def _nbytes(data: Any) -> int:
    return memoryview(data).nbytes if type(data) in (bytes, bytearray, memoryview) else 0


def _tensor_copies(data: Any, dtype: Any, shape: Any, requires_grad: Any, was_cuda: Any, parameter: Any) -> int:
    nbytes = _nbytes(data)
    copied = nbytes if nbytes and memoryview(data).readonly else 0  # see tensor(): read-only bytes are copied
    return copied + (nbytes if was_cuda is True and receive_device.get() is not None else 0)


def _items(value: Any, kind: type[tuple[Any, ...] | dict[Any, Any] | list[Any]], per_item: int) -> int:
    return per_item * len(value) if type(value) is kind else 0


def _path_copies(kind: Any, text: Any) -> int:
    # What a path derives from its string (parts, interned; a lower-cased copy; its str and hash):
    # up to about 55 bytes per byte of text, for parts of two characters.
    return 64 * len(text) * (1 if text.isascii() else 4) if type(text) is str else 0


# What each call copies of its arguments, in bytes. An argument may be a memo reference that many
# calls share, so every call pays for its own copy.
_COPIES: dict[Callable[..., Any], Callable[..., int]] = {
    tensor: _tensor_copies,
    torch_size: lambda dims: _items(dims, tuple, 8),
    path: _path_copies,
    ordered_dict: lambda items: _items(items, dict, 256),  # a dict and a linked list of nodes
    default_dict: lambda factory, items: _items(items, dict, 136),
    counter: lambda items: _items(items, dict, 136),
    deque: lambda items, maxlen: _items(items, list, 16),
}


def allocation(rebuilder: Callable[..., Any], args: tuple[Any, ...]) -> int:
    """An upper bound of the bytes ``rebuilder(*args)`` allocates (a move to the GPU included),
    known before the call; arguments of the wrong number or type (refused by the call) cost its header."""
    copies = _COPIES.get(rebuilder)
    try:
        return _CALL_BYTES + (copies(*args) if copies is not None else 0)
    except TypeError:  # the wrong number of arguments: the call refuses them
        return _CALL_BYTES


# -- the sending side --------------------------------------------------------------------------

Reduction = tuple[Callable[..., Any], tuple[Any, ...]]


def reduce_tensor(value: torch.Tensor, parameter: bool = False) -> Reduction | None:
    """Raw bytes, dtype and shape of a strided tensor of a wire dtype; ``None`` for any other tensor."""
    if str(value.dtype) not in TORCH_DTYPES or value.layout != torch.strided or value.is_quantized:
        return None
    if value.device.type == "meta":
        return None
    was_cuda = value.device.type != "cpu"
    flat = value.detach().cpu().resolve_conj().resolve_neg().contiguous().reshape(-1)
    raw = flat.view(torch.uint8).numpy() if flat.numel() else np.empty(0, np.uint8)
    args = (
        pickle.PickleBuffer(raw.data),
        str(value.dtype),
        tuple(value.shape),
        value.requires_grad,
        was_cuda,
        parameter,
    )
    return tensor, args


def _is_plain(kind: np.dtype[Any]) -> bool:
    plain = NUMPY_DTYPES.get(kind.str)
    return plain is not None and plain == kind and kind.metadata is None


def _reduce_ndarray(value: np.ndarray) -> Reduction:
    kind = value.dtype
    if not _is_plain(kind):
        raise NotRebuildable(f"a NumPy array of dtype {kind}: only plain dtypes ({', '.join(_PLAIN_NUMPY)}) are sent")
    fortran = value.flags.f_contiguous and not value.flags.c_contiguous
    data = value if fortran or value.flags.c_contiguous else value.copy(order="C")
    return ndarray, (pickle.PickleBuffer(data.data), kind.str, value.shape, fortran)


def _reduce_tensor(value: torch.Tensor) -> Reduction:
    reduction = reduce_tensor(value, parameter=type(value) is torch.nn.Parameter)
    if reduction is None:
        raise NotRebuildable(f"a {value.dtype} tensor of layout {value.layout} on {value.device}")
    return reduction


def _reduce_datetime(value: dt.datetime) -> Reduction:
    fields = (value.year, value.month, value.day, value.hour, value.minute, value.second, value.microsecond)
    return datetime, (*fields, value.tzinfo, value.fold)


def _reduce_time(value: dt.time) -> Reduction:
    return time, (value.hour, value.minute, value.second, value.microsecond, value.tzinfo, value.fold)


def _reduce_timezone(value: dt.timezone) -> Reduction:
    offset = value.utcoffset(None)
    name = value.tzname(None)
    return timezone, (offset, None if dt.timezone(offset).tzname(None) == name else name)


def _reduce_defaultdict(value: collections.defaultdict[Any, Any]) -> Reduction:
    factory = value.default_factory
    if factory is not None and not any(factory is allowed for allowed in FACTORIES):
        raise NotRebuildable(f"a defaultdict whose factory is {factory!r}: only None and builtin types are sent")
    return default_dict, (factory, dict(value))


_REDUCERS: dict[type, Callable[[Any], Reduction]] = {
    np.ndarray: _reduce_ndarray,
    torch.Tensor: _reduce_tensor,
    torch.nn.Parameter: _reduce_tensor,
    torch.Size: lambda v: (torch_size, (tuple(v),)),
    torch.device: lambda v: (torch_device, (v.type, v.index)),
    complex: lambda v: (complex_number, (v.real, v.imag)),
    dt.date: lambda v: (date, (v.year, v.month, v.day)),
    dt.time: _reduce_time,
    dt.datetime: _reduce_datetime,
    dt.timedelta: lambda v: (timedelta, (v.days, v.seconds, v.microseconds)),
    dt.timezone: _reduce_timezone,
    collections.OrderedDict: lambda v: (ordered_dict, (dict(v),)),
    collections.defaultdict: _reduce_defaultdict,
    collections.Counter: lambda v: (counter, (dict(v),)),
    collections.deque: lambda v: (deque, (list(v), v.maxlen)),
    **{cls: (lambda v: (path, (type(v).__name__, str(v)))) for cls in _PATHS.values()},
}


def safe_reduction(value: Any) -> Reduction | None:
    """How the ``"safe"`` codec sends ``value``: a function above and its plain arguments.

    ``None`` for types it does not rebuild; ``NotRebuildable`` for a supported type it cannot send
    (an object array, a sparse tensor, a string scalar, ...).
    """
    reduce = _REDUCERS.get(type(value))
    if reduce is not None:
        return reduce(value)
    if isinstance(value, (np.ndarray, torch.Tensor)):
        kind = "an ndarray" if isinstance(value, np.ndarray) else "a tensor"
        raise NotRebuildable(f"a {type(value).__qualname__} ({kind} subclass): send a plain one (np.asarray, .data)")
    if isinstance(value, np.generic):
        if not _is_plain(value.dtype):
            raise NotRebuildable(f"a NumPy scalar of dtype {value.dtype}")
        return numpy_scalar, (value.dtype.str, value.tobytes())
    if isinstance(value, np.dtype):
        if not _is_plain(value):
            raise NotRebuildable(f"the NumPy dtype {value}: only plain dtypes ({', '.join(_PLAIN_NUMPY)}) are sent")
        return numpy_dtype, (value.str,)
    return None
