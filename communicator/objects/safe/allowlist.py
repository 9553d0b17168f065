"""What the ``"safe"`` serializer lets a payload name and call: the allow-list (:data:`CALLABLES`,
:data:`VALUES`), the names a user trusts, and the refusals of what is on neither."""

from __future__ import annotations

import importlib
import pickle
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

import communicator.objects.safe.rebuild as rebuild

__all__ = [
    "ALLOWED",
    "CALLABLES",
    "CALLABLE_BY_ID",
    "VALUES",
    "VALUE_NAMES",
    "UnsafePayloadError",
    "call_rebuilder",
    "qualified_name",
    "is_trusted",
    "malformed",
    "refusal",
    "resolve_trusted",
]


class UnsafePayloadError(pickle.UnpicklingError):
    """The ``"safe"`` serializer refused a payload, or a value that it would not send."""


#: What a payload may call: the functions of ``communicator.objects.safe.rebuild``, which check their arguments.
CALLABLES: dict[tuple[str, str], Callable[..., Any]] = {(rebuild.__name__, f.__name__): f for f in rebuild.REBUILDERS}
#: What a payload may name but never call: builtin types (``defaultdict`` factories), the scalar
#: types of plain NumPy dtypes and the tensor dtypes the library sends.
VALUES: dict[tuple[str, str], object] = {
    **{("builtins", cls.__name__): cls for cls in rebuild.FACTORIES},
    **{(cls.__module__, cls.__qualname__): cls for cls in rebuild.NUMPY_SCALAR_TYPES},
    **{("torch", name.removeprefix("torch.")): kind for name, kind in rebuild.TORCH_DTYPES.items()},
}
ALLOWED = {**CALLABLES, **VALUES}
CALLABLE_BY_ID = {id(f): f for f in CALLABLES.values()}
VALUE_NAMES = {id(value): f"{module}.{name}" for (module, name), value in VALUES.items()}


def refusal(qualified: str) -> str:
    return (
        f"the 'safe' serializer refused {qualified}: it is not on the allow-list of plain values "
        f"(see the threat model in the objects documentation); add it to CommConfig(trusted=[{qualified!r}]) "
        "if you trust it"
    )


def _listed(module: str, name: str, trusted: Sequence[str]) -> bool:
    """``module.name`` is listed exactly."""
    return f"{module}.{name}" in trusted


def _under_prefix(module: str, trusted: Sequence[str]) -> bool:
    """``module`` is inside a listed prefix (``"pkg."``), and is no ``__main__``: a prefix never
    reaches a script's own module."""
    return "__main__" not in module.split(".") and any(
        entry.endswith(".") and f"{module}.".startswith(entry) for entry in trusted
    )


def is_trusted(module: str, name: str, trusted: Sequence[str], is_class: bool) -> bool:
    """Listed exactly, or a class under a listed prefix: a prefix trusts no function."""
    return _listed(module, name, trusted) or (is_class and _under_prefix(module, trusted))


def resolve_trusted(module: str, name: str, trusted: Sequence[str]) -> Any:
    if not name.isidentifier() or not all(part.isidentifier() for part in module.split(".")):
        raise UnsafePayloadError(
            f"the 'safe' serializer refused the name {name!r} in module {module!r}: a name is looked up "
            "in its module only, never through attributes (trust classes defined at module level)"
        )
    listed = _listed(module, name, trusted)
    if not listed and not _under_prefix(module, trusted):
        raise UnsafePayloadError(refusal(f"{module}.{name}"))
    loaded = sys.modules.get(module)
    if loaded is None and not listed:  # importing would run the module's code: a prefix never imports
        raise UnsafePayloadError(
            f"the 'safe' serializer refused {module}.{name}: a trusted prefix looks names up only in modules "
            f"this process has already imported, and {module!r} is not one (import it first, or trust "
            f"the exact name {module}.{name})"
        )
    try:
        found = vars(loaded if loaded is not None else importlib.import_module(module)).get(name)
    except ImportError as error:
        raise UnsafePayloadError(
            f"the 'safe' serializer cannot import the trusted module {module!r}: {error}"
        ) from None
    if getattr(found, "__module__", None) != module or getattr(found, "__qualname__", None) != name:
        raise UnsafePayloadError(
            f"the 'safe' serializer refused {module}.{name}: it is not a class or function defined under "
            "that name in that module"
        )
    if not listed and not isinstance(found, type):
        raise UnsafePayloadError(
            f"the 'safe' serializer refused {module}.{name}: a trusted prefix trusts classes only, never "
            f"functions (trust the exact name {module}.{name} to let payloads call it)"
        )
    return found


def qualified_name(value: Any) -> str:
    """``module.name`` of a class or function, else ``a <type>``."""
    module, name = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)) and module and name:
        return f"{module}.{name}"
    cls = type(value)
    return "a " + (cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}")


def malformed(what: str) -> UnsafePayloadError:
    return UnsafePayloadError(f"the 'safe' serializer refused a malformed payload: {what}")


def call_rebuilder(rebuilder: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """Call a rebuilder; its complaint about an argument becomes a refusal naming it."""
    try:
        return rebuilder(*args)
    except (pickle.UnpicklingError, ValueError, TypeError, OverflowError, RuntimeError, NotImplementedError) as error:
        raise UnsafePayloadError(
            f"the 'safe' serializer refused {rebuild.__name__}.{rebuilder.__name__}: {error}"
        ) from None
