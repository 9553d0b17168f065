"""The shape records of the gathers of unknown shapes (a mixin of ``Communicator``): how they
travel (all-gathered for ``all_gather``, to the destination alone for ``gather``), each carrying
its rank's tensor where it fits. Their format is :mod:`communicator.ops.shapes`'."""

from __future__ import annotations

import itertools

import numpy as np
import torch

import communicator.ops.shapes as shapes
from communicator.handles import Handle
from communicator.ops.staging import homed
from communicator.ops.tensors import TensorHost, _finished

__all__ = ["ShapeRecords"]

Tensor = torch.Tensor
_NOTHING = torch.empty(0, dtype=torch.uint8)  # what a rank sends or receives in a gather that moves nothing of its


class ShapeRecords:
    """Every rank's record of its tensor, exchanged before a gather's data."""

    def _metas(self: TensorHost, source: Tensor) -> list[shapes.Meta]:
        """Every rank's record of its tensor (see :mod:`communicator.ops.shapes`), in rank order,
        in one collective; on the CPU, each carries its tensor when it fits ``_capacity``."""
        if self.device.type != "cpu":  # the records travel on the CPU, as object headers do
            metas = [shapes.read(row) for row in self._objects().channel.all_gather(shapes.pack_meta(source))]
        else:
            mine = shapes.pack_meta(source, shapes.META_BYTES + self._capacity)
            rows = [torch.empty(mine.size, dtype=torch.uint8) for _ in range(self.world_size)]
            if self.world_size > 1:
                self._await([self._start(self._all_gather, rows, torch.from_numpy(mine))])
            metas = [shapes.read(mine if r == self.rank else row.numpy()) for r, row in enumerate(rows)]
        shapes.check_compatible(metas, self._calls.op)
        self._capacity = shapes.capacity_for(metas)  # alike on every rank: each saw every record
        return metas

    def _gather_to(
        self: TensorHost, tensor: Tensor, source: Tensor, dst: int, async_op: bool
    ) -> list[Tensor] | Handle[list[Tensor] | None] | None:
        """``gather`` on more than one rank: every other rank's record to ``dst`` alone, in one
        collective whose parts may differ in size (``_gather``), each carrying its tensor where
        it fits; a tensor that does not follows its record at once, point to point. What a
        rank's record to ``dst`` carries follows its tensor in their previous gather, which
        both of them know (:func:`communicator.ops.shapes.capacity_of`). ``dst`` checks the
        records; the other ranks need nobody's (their arguments were compared by
        ``check_arguments``)."""
        rank, world, device = self.rank, self.world_size, self.device
        cpu = device.type == "cpu"  # records travel on the CPU: with the data there, else on the object channel
        if rank != dst:
            capacity = self._gather_capacity(rank, dst) if cpu else 0
            mine = shapes.pack_meta(source, shapes.META_BYTES + capacity)
            nbytes = source.nbytes
            self._gather_capacities[rank, dst] = shapes.capacity_of(nbytes)
            self._calls.count(nbytes, 0, nbytes * world)  # the others' parts are unknown here
            # what does not fit goes at once, behind the record (one tag: received in the order sent)
            works = self._transfers({} if cpu and nbytes <= capacity else {dst: source}, {})
            if cpu:
                self._await([self._start(self._gather, _NOTHING, (), torch.from_numpy(mine), dst)])
            else:
                self._objects().channel.exchange({dst: mine}, {})
            return _finished(self, works, lambda: None, async_op)
        sizes = [shapes.META_BYTES + (self._gather_capacity(r, dst) if cpu else 0) for r in range(world)]
        sizes[dst] = 0  # its own record moves nowhere
        starts = [0, *itertools.accumulate(sizes)]
        if cpu:
            flat = torch.empty(starts[-1], dtype=torch.uint8)
            self._await([self._start(self._gather, flat, sizes, _NOTHING, dst)])
            rows = flat.numpy()
        else:
            rows = np.empty(starts[-1], dtype=np.uint8)
        parts = [rows[starts[r] : starts[r + 1]] for r in range(world)]
        if not cpu:
            self._objects().channel.exchange({}, {r: part for r, part in enumerate(parts) if r != dst})
        metas = [shapes.described(source) if r == dst else shapes.read(part) for r, part in enumerate(parts)]
        for r, meta in enumerate(metas):
            if r != dst:
                self._gather_capacities[r, dst] = shapes.capacity_of(meta.wire_bytes)
        total = sum(m.wire_bytes for m in metas)
        self._calls.count(0, total - source.nbytes, total)
        if not shapes.compatible(metas):  # what was sent is received all the same: the communicator stays usable
            scratch = {r: torch.empty(m.wire_bytes, dtype=torch.uint8, device=device) for r, m in enumerate(metas)}
            self._await(self._transfers({}, {r: t for r, t in scratch.items() if r != dst and metas[r].data is None}))
            shapes.check_compatible(metas, self._calls.op)
        outputs = shapes.outputs(metas, source, dst, device, fault_in=False, views=True)  # the records are new
        waiting = {r: outputs[r] for r, m in enumerate(metas) if m.data is None and r != dst}
        return _finished(self, self._transfers({}, waiting), homed(lambda: outputs, tensor, self.device), async_op)

    def _gather_capacity(self: TensorHost, sender: int, dst: int) -> int:
        """What ``sender``'s record to ``dst`` carries in this gather (both of them know it)."""
        return self._gather_capacities.get((sender, dst), shapes.INLINE_BYTES)
