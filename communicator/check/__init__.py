"""``communicator check``: run every collective once across the ranks of a job and verify each result.

    srun -n 8 communicator check
    mpirun -np 4 python -m communicator check
    torchrun --nproc-per-node 4 -m communicator check
    python -m communicator check --local 4        # starts 4 local gloo ranks itself
    python -m communicator check                  # no launcher: one process (NonDistComm)

Every rank runs each check of :data:`CHECKS` on each size. A check calls the communicator, then
compares what it got with what it must get, computed locally from the rank numbers alone. Each
rank records pass/fail and the time of every (op, size); rank 0 gathers every rank's records and
prints one row per (op, size): ``pass`` when every rank passed, ``FAIL`` (with the first error)
when any rank failed, ``skip`` when the op does not apply (point-to-point in a world of one).
Every rank exits with the same status: 0 when nothing failed anywhere, 1 otherwise.

A failing check does not stop the others. If the communicator itself breaks (another rank failed,
a peer was lost, an op timed out), the run stops: each rank says where it stopped (rank 0 also
prints its table so far) and leaves its ``with`` block with :class:`Aborted`, which releases the
other ranks promptly; every rank exits with status 1.

Other code can run its own table of checks:

```python
from communicator.check import Check, Mismatch, check_job

def my_check(comm, n):
    got = comm.all_gather_object(comm.rank)
    if got != list(range(comm.world_size)):
        raise Mismatch(f"got {got}")

status = check_job(comm, [Check("my op", my_check, sized=False)])
```
"""

from communicator.check.catalogue import CHECKS, DEFAULT_SIZES, SIZES, Check
from communicator.check.report import Outcome, render
from communicator.check.runner import FATAL, Aborted, check_job, run_checks
from communicator.check.values import Mismatch, Skip

__all__ = [
    "CHECKS",
    "DEFAULT_SIZES",
    "FATAL",
    "SIZES",
    "Aborted",
    "Check",
    "Mismatch",
    "Outcome",
    "Skip",
    "check_job",
    "render",
    "run_checks",
]
