"""Make mmengine itself (its ``Runner``, hooks and evaluator) call :mod:`communicator.dist`."""

from __future__ import annotations

import importlib
import sys
import types

__all__ = ["MMENGINE_MODULES", "use_for_mmengine"]

#: The modules mmengine's code imports its distributed functions from.
MMENGINE_MODULES = ("mmengine.dist", "mmengine.dist.dist", "mmengine.dist.utils")


def use_for_mmengine() -> None:
    """Route every ``mmengine.dist`` call of this process to :mod:`communicator.dist`.

    Call it once per process (every rank), best before mmengine is imported; mmengine's modules
    imported earlier have their bound ``mmengine.dist`` functions replaced too. Idempotent.

    Example:
        ```python
        import communicator.dist
        communicator.dist.use_for_mmengine()
        from mmengine.runner import Runner   # its hooks and metrics now use communicator.dist
        ```
    """
    ours = sys.modules["communicator.dist"]
    for name in MMENGINE_MODULES:
        sys.modules[name] = ours
    try:  # its package imports parts that import mmengine.dist: after the swap, they get ours
        package = importlib.import_module("mmengine")
    except ImportError:
        return
    package.dist = ours  # type: ignore[attr-defined]  # `import mmengine.dist`, then `mmengine.dist.x`
    for name, module in list(sys.modules.items()):
        if name.startswith("mmengine.") and isinstance(module, types.ModuleType) and module is not ours:
            _rebind(module, ours)


def _rebind(module: types.ModuleType, ours: types.ModuleType) -> None:
    """Names ``module`` imported from mmengine.dist (``from mmengine.dist import get_rank``) now mean ours."""
    for attribute, value in list(vars(module).items()):
        origin = getattr(value, "__module__", None) or ""
        if origin.startswith("mmengine.dist") and callable(value) and hasattr(ours, attribute):
            setattr(module, attribute, getattr(ours, attribute))
