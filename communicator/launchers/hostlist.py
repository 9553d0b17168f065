"""Slurm hostlists (``node[01-04,07],gpu-a[1-2]``) expanded in pure Python, so no ``scontrol`` is needed."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from communicator.errors import ConfigError
from communicator.launchers.base import is_host

__all__ = ["expand_hostlist", "first_host"]


@dataclass(frozen=True)
class _Span:
    """One ``lo-hi`` (or single ``n``) entry of a bracket group; ``width`` keeps zero padding."""

    first: int
    last: int
    width: int

    def names(self) -> Iterator[str]:
        for number in range(self.first, self.last + 1):
            yield str(number).zfill(self.width)


# A host pattern is a sequence of literal text and bracket groups (alternatives).
_Part = str | tuple[_Span, ...]


def expand_hostlist(hostlist: str) -> list[str]:
    """Every host name in a Slurm hostlist, in Slurm's order.

    ``node[01-03,07],gpu-a[1-2]`` gives ``node01 node02 node03 node07 gpu-a1 gpu-a2``; several
    bracket groups multiply (``rack[1-2]-n[1-2]``: the first group varies slowest). Unbalanced
    brackets, empty names and bad ranges (``a[3-1]``, ``a[x-2]``) raise ConfigError.
    """
    return [host for pattern in _parse(hostlist) for host in _expand(pattern)]


def first_host(nodelist: str, environ: Mapping[str, str]) -> str:
    """The first host of ``nodelist`` (where Slurm places task 0).

    Expansion is done in Python; ``scontrol show hostnames`` (looked up on ``environ``'s PATH) is
    asked only when the hostlist uses syntax this parser rejects. When both fail the parser's
    ConfigError is raised.
    """
    try:
        return next(_expand(_parse(nodelist)[0]))
    except ConfigError:
        host = _scontrol_first_host(nodelist, environ)
        if host is None:
            raise
        return host


def _scontrol_first_host(nodelist: str, environ: Mapping[str, str]) -> str | None:
    path = environ.get("PATH")
    scontrol = None if path is None else shutil.which("scontrol", path=path)
    if scontrol is None:
        return None
    try:
        done = subprocess.run(
            [scontrol, "show", "hostnames", nodelist],
            env=dict(environ),
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    hosts = done.stdout.split()
    # scontrol echoes some malformed lists back unchanged: only a real host name counts.
    return hosts[0] if done.returncode == 0 and hosts and is_host(hosts[0]) else None


def _parse(hostlist: str) -> list[list[_Part]]:
    """Host patterns of ``hostlist``, split at the commas outside brackets."""
    text = hostlist.strip()
    if not text:
        raise ConfigError(f"hostlist {hostlist!r} is empty; expected names like 'node[01-04],gpu1'")
    patterns: list[list[_Part]] = []
    parts: list[_Part] = []
    literal = ""
    position = 0
    while position < len(text):
        char = text[position]
        if char == ",":
            patterns.append(_finish(parts, literal, hostlist))
            parts, literal = [], ""
        elif char == "[":
            close = text.find("]", position + 1)
            if close < 0 or "[" in text[position + 1 : close]:
                raise ConfigError(f"hostlist {hostlist!r} has an unbalanced '['; expected 'name[1-4]'")
            if literal:
                parts.append(literal)
                literal = ""
            parts.append(_group(text[position + 1 : close], hostlist))
            position = close
        elif char == "]":
            raise ConfigError(f"hostlist {hostlist!r} has a ']' without '['; expected 'name[1-4]'")
        else:
            literal += char
        position += 1
    patterns.append(_finish(parts, literal, hostlist))
    return patterns


def _finish(parts: list[_Part], literal: str, hostlist: str) -> list[_Part]:
    """The pattern built so far, plus its trailing literal; an empty pattern is an error."""
    pattern = [*parts, literal] if literal else parts
    if not pattern:
        raise ConfigError(f"hostlist {hostlist!r} has an empty name; expected names between commas")
    return pattern


def _group(inner: str, hostlist: str) -> tuple[_Span, ...]:
    """The spans of one bracket group such as ``01-04,07``."""
    return tuple(_span(entry, hostlist) for entry in inner.split(","))


def _span(entry: str, hostlist: str) -> _Span:
    bounds = entry.split("-")
    if len(bounds) > 2 or not all(bound.isdigit() and bound.isascii() for bound in bounds):
        raise ConfigError(f"hostlist {hostlist!r} has a bad range {entry!r}; expected 'n' or 'lo-hi' with digits")
    first, last = int(bounds[0]), int(bounds[-1])
    if last < first:
        raise ConfigError(f"hostlist {hostlist!r} has a decreasing range {entry!r}; expected lo <= hi")
    return _Span(first, last, len(bounds[0]))


def _expand(pattern: Sequence[_Part]) -> Iterator[str]:
    """Host names of one pattern, generated lazily so ``first_host`` never builds the full list."""
    if not pattern:
        yield ""
        return
    head, rest = pattern[0], pattern[1:]
    heads: Iterable[str] = [head] if isinstance(head, str) else (name for span in head for name in span.names())
    for prefix in heads:
        for suffix in _expand(rest):
            yield prefix + suffix
