"""A forked child (a DataLoader worker, say) inherits the parent's communicator object but not its
connections: every operation there raises a clear ``CommError``, and closing it there (``close()``,
the end of a ``with`` block, ``sys.exit``) leaves the parent's job alone."""

from __future__ import annotations

import atexit
import os

import pytest
import torch

from communicator import Communicator
from communicator.testing import run_ranks


def _child(comm: Communicator, ending: str) -> None:
    """In the forked child: an operation, then the ending under test; report through the exit status."""
    try:
        comm.all_reduce(torch.ones(1))
        code = 3  # it should have been refused
    except Exception as error:  # noqa: BLE001 - the status tells the parent what came out
        code = 0 if "fork" in str(error) and type(error).__name__ == "CommError" else 4
    if ending == "close":
        comm.close()
    elif ending == "block":
        comm.__exit__(SystemExit, SystemExit(code), None)  # the end of the parent's with block, in the child
    elif ending == "exit":
        atexit._run_exitfuncs()  # the interpreter's exit: what was left open is closed
    os._exit(code)


def _forks(comm: Communicator, ending: str) -> tuple[int, float]:
    with comm:
        pid = os.fork()
        if pid == 0:
            _child(comm, ending)
        _, status = os.waitpid(pid, 0)
        after = comm.all_reduce(torch.ones(1))  # the parent's job goes on, with every rank
        comm.barrier()
    return os.waitstatus_to_exitcode(status), after.item()


@pytest.mark.parametrize("ending", ["close", "block", "exit", "none"])
def test_a_forked_child_cannot_use_the_parent_s_communicator(ending: str) -> None:
    assert run_ranks(_forks, 2, ending, timeout=60) == [(0, 2.0), (0, 2.0)]
