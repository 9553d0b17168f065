"""The torch process groups a job's communicators create: each once, in torch's order, with a gloo
companion for object traffic when the backend is not gloo.

torch's rule is that every process of the job creates every group, in the same order. A world
communicator follows it: ``split`` creates every part on every rank. A subgroup cannot (the
other ranks of the job never call its ``split``), so its parts are created by their members only
(``use_local_synchronization``) under a name the members derive alike.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from communicator.startup import leave_together

__all__ = ["GroupPair", "Groups", "named_group"]

#: A torch group and the gloo group its objects travel on (the same group under gloo).
GroupPair = tuple[dist.ProcessGroup, dist.ProcessGroup]


@contextlib.contextmanager
def _group_name(name: str) -> Iterator[None]:
    # torch names a members-only group after the number of groups this process knows, which differs
    # between ranks that were members of earlier groups and ranks that were not: the members would
    # rendezvous under different names and hang. They share ``name`` instead. This replaces a private
    # torch function for the duration of one ``new_group`` call (tests check it still exists).
    c10d = dist.distributed_c10d
    derive = c10d._process_group_name
    c10d._process_group_name = lambda ranks, use_hashed_name: c10d.GroupName(name)
    try:
        yield
    finally:
        c10d._process_group_name = derive


def named_group(world_ranks: tuple[int, ...], timeout: timedelta, backend: str | None, name: str | None) -> Any:
    """``dist.new_group`` over ``world_ranks``: by every rank (``name=None``) or by the members
    only, rendezvousing under ``name``. A gloo group's members leave together: each member's
    connections are made on both ends before any member goes on."""
    if name is None:
        group = dist.new_group(list(world_ranks), timeout=timeout, backend=backend)
    else:
        with _group_name(name):
            group = dist.new_group(list(world_ranks), timeout=timeout, backend=backend, use_local_synchronization=True)
    if group is not dist.GroupMember.NON_GROUP_MEMBER:
        leave_together(group)
    return group


class Groups:
    """The groups one world communicator and its subgroups created, by (sorted world ranks, who made it)."""

    def __init__(self, backend: str, timeout: timedelta) -> None:
        self._backend, self._timeout = backend, timeout
        self._made: dict[tuple[tuple[int, ...], bool], GroupPair] = {}

    def pair(self, world_ranks: tuple[int, ...], name: str | None) -> GroupPair:
        """The group over ``world_ranks`` (sorted) and its companion, created on first use.

        ``name=None``: every rank of the job takes part. Otherwise only the members, under ``name``.
        """
        shared = (world_ranks, True)
        if name is not None and shared in self._made:
            return self._made[shared]  # every rank created this one: the members have it
        key = (world_ranks, name is None)
        if key not in self._made:
            group = named_group(world_ranks, self._timeout, self._backend, name)  # never torch's default's
            companion = group
            if self._backend != "gloo":
                companion = named_group(world_ranks, self._timeout, "gloo", None if name is None else f"{name}cpu")
            self._made[key] = (group, companion)
        return self._made[key]

    def companion_of(self, group: dist.ProcessGroup, world_ranks: tuple[int, ...], name: str) -> GroupPair:
        """``group`` (created elsewhere) and a gloo companion for it, made by its members once."""
        key = (world_ranks, False)
        if dist.get_backend(group) == "gloo":
            return group, group
        if key not in self._made:
            self._made[key] = (group, named_group(world_ranks, self._timeout, "gloo", f"{name}cpu"))
        return self._made[key]

    def keep_alive(self, *others: dist.ProcessGroup) -> None:
        """Never free the groups created here, nor ``others``: after an abandoned operation a gloo
        worker thread stays blocked in it (gloo's ``abort()`` does not release it), and a group's
        destructor joins that thread, holding the exiting process until the timeout."""
        for group in [g for pair in self._made.values() for g in pair] + list(others):
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))

    def destroy(self) -> None:
        """Destroy the groups created here (not the default group), e.g. when an adopted world closes."""
        for group in {id(g): g for pair in self._made.values() for g in pair}.values():
            with contextlib.suppress(Exception):
                dist.destroy_process_group(group)
        self.forget()

    def forget(self) -> None:
        """Drop the references to the groups created here (torch has destroyed them)."""
        self._made.clear()
