"""``communicator check``: run every collective once across the ranks of a job and verify each result.

    srun -n 8 communicator check
    mpirun -np 4 python -m communicator check
    torchrun --nproc-per-node 4 -m communicator check
    python -m communicator check --local 4        # starts 4 local gloo ranks itself
    python -m communicator check                  # no launcher: one process (NonDistComm)

Every rank runs each check of :data:`CHECKS` on each size: once, then ``--repeat`` more times
(3 by default). A check calls the communicator, then compares what it got with what it must get,
computed locally from the rank numbers alone. Each rank records pass/fail and the op's time of
every (op, size): the time inside the communicator's calls, not the check of their result, the
median of the repeated runs (so a first call's connections and warm-up do not make it); rank 0
gathers every rank's records and prints one row per (op, size): ``pass`` when every run passed on
every rank, ``FAIL`` (with the first error) when any failed, ``skip`` when the op does not apply
(point-to-point in a world of one), and the slowest rank's time. Every rank exits with the same
status: 0 when nothing failed anywhere, 1 otherwise.

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
from communicator.check.runner import FATAL, TIMED_RUNS, Aborted, check_job, run_checks
from communicator.check.values import Mismatch, Skip

__all__ = [
    "CHECKS",
    "DEFAULT_SIZES",
    "FATAL",
    "SIZES",
    "TIMED_RUNS",
    "Aborted",
    "Check",
    "Mismatch",
    "Outcome",
    "Skip",
    "check_job",
    "render",
    "run_checks",
]
