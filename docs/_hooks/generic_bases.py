"""Griffe extension: a generic mixin's type variable shows as the class it stands for.

``Communicator`` derives from ``Splitting["Communicator"]``, whose methods return ``C`` (a type
variable, so that ``splits.py`` need not import ``base.py``). The API reference lists them among
``Communicator``'s own methods, where a bare ``C`` means nothing to a reader: in every class with
a base ``Mixin[Arg]``, the mixin's type variable is written as ``Arg`` instead.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import griffe


def _substitute(expr: Any, names: dict[str, str], scope: griffe.Object) -> Any:
    """``expr`` with each name in ``names`` replaced (a copy; the other nodes are shared)."""
    if isinstance(expr, griffe.ExprName) and expr.name in names:
        return griffe.ExprName(names[expr.name], parent=scope)
    if isinstance(expr, list):
        return [_substitute(item, names, scope) for item in expr]
    if not dataclasses.is_dataclass(expr) or isinstance(expr, type):
        return expr
    changes = {
        field.name: _substitute(getattr(expr, field.name), names, scope)
        for field in dataclasses.fields(expr)
        if field.name != "parent" and isinstance(getattr(expr, field.name), griffe.Expr | list)
    }
    return dataclasses.replace(expr, **changes) if changes else expr


def _type_parameters(mixin: griffe.Class) -> list[str]:
    """The names in the mixin's ``Generic[...]`` base."""
    for base in mixin.bases:
        if isinstance(base, griffe.ExprSubscript) and str(base.left) in ("Generic", "typing.Generic"):
            items = base.slice.elements if isinstance(base.slice, griffe.ExprTuple) else [base.slice]
            return [str(item) for item in items]
    return []


class BoundTypeVariables(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for module in pkg.modules.values():
            for cls in module.classes.values():
                self._bind(cls)

    def _bind(self, cls: griffe.Class) -> None:
        for base in cls.bases:
            if not isinstance(base, griffe.ExprSubscript):
                continue
            try:
                mixin = cls.modules_collection[base.left.canonical_path]
            except (KeyError, AttributeError):
                continue
            if not isinstance(mixin, griffe.Class):
                continue
            arguments = base.slice.elements if isinstance(base.slice, griffe.ExprTuple) else [base.slice]
            names = dict(zip(_type_parameters(mixin), (str(a).strip("'\"") for a in arguments), strict=False))
            if not names:
                continue
            for member in mixin.members.values():
                if isinstance(member, griffe.Function):
                    member.returns = _substitute(member.returns, names, cls)
                    for parameter in member.parameters:
                        parameter.annotation = _substitute(parameter.annotation, names, cls)
                elif isinstance(member, griffe.Attribute):
                    member.annotation = _substitute(member.annotation, names, cls)
