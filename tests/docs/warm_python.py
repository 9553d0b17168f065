"""A warm interpreter for the documentation's scripts.

``python SCRIPT`` costs two imports of torch before the script's own work: the interpreter's, and
the fork server's that ``launch()`` starts (about 2 s of CPU each on a 2-core machine, most of the
docs tests' time). Here one interpreter imports torch, numpy and communicator and starts the fork
server once; each script then runs as ``__main__`` in a child forked from it, with the script's
directory, working directory, environment, arguments and output files, and its ``launch()`` asks
that fork server for its ranks (they import the script as ``__mp_main__`` and unpickle its
function, as ranks always do). The ranks' own output goes to the warm interpreter's log: results
come back through ``launch()``. What differs from a fresh interpreter is what was imported before
the script started; the tests that depend on a fresh one (no ``__main__`` guard, ``--help`` without
torch, the README's commands) keep starting one.

``torchrun --nproc-per-node N SCRIPT`` runs the same way: a child of the server plays torchrun's
agent (it serves the job's store at ``MASTER_PORT``, as the agent does) and forks N workers, each
given the variables torchrun gives its workers, running the script as ``__main__``; a worker that
fails ends the others, as torchrun ends them. torchrun itself is run for real by the launcher tests.

Run as a script, this module is the server: one JSON request a line on stdin, one reply a line.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import runpy
import subprocess
import sys
import traceback
from pathlib import Path
from typing import IO, Any

LOG_ENV = "WARM_PYTHON_LOG"


class WarmPython:
    """The client: starts the server in a session of its own and runs scripts through it."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self._env = {**env, LOG_ENV: str(log)}
        self._log = log
        self._process: subprocess.Popen[str] | None = None

    def run(
        self, argv: list[str], cwd: Path, env: dict[str, str], timeout: float, *, torchrun: int = 0
    ) -> subprocess.CompletedProcess[str]:
        """``python *argv`` (``torchrun --nproc-per-node N *argv`` with ``torchrun=N``) in ``cwd``
        with ``env``; killed with the server after ``timeout`` seconds."""
        process = self._server()
        out, err = cwd / f".warm-{os.getpid()}.out", cwd / f".warm-{os.getpid()}.err"
        request = {"argv": argv, "cwd": str(cwd), "env": env, "torchrun": torchrun}
        request |= {"stdout": str(out), "stderr": str(err)}
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps(request) + "\n")
        process.stdin.flush()
        reply = _read_line(process.stdout, timeout)
        if reply is None:
            self.close()
            raise subprocess.TimeoutExpired([sys.executable, *argv], timeout)
        code = json.loads(reply)["code"]
        stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
        out.unlink()
        err.unlink()
        return subprocess.CompletedProcess([sys.executable, *argv], code, stdout, stderr)

    def close(self) -> None:
        if self._process is not None:
            _kill_session(self._process)
            self._process = None

    def _server(self) -> subprocess.Popen[str]:
        if self._process is None or self._process.poll() is not None:
            self._process = subprocess.Popen(
                [sys.executable, __file__],
                env=self._env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,  # the server, its fork server and every rank: one group to kill
            )
        return self._process


def _read_line(stream: IO[str], timeout: float) -> str | None:
    import selectors

    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        if not selector.select(timeout):
            return None
    return stream.readline() or None


def _kill_session(process: subprocess.Popen[str]) -> None:
    import signal

    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def serve() -> None:
    import multiprocessing.forkserver

    import numpy  # noqa: F401
    import torch  # noqa: F401

    from communicator.testing import spawn

    replies = os.fdopen(os.dup(1), "w", buffering=1)
    log = os.open(os.environ.pop(LOG_ENV), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)  # the fork server's and the ranks' output: never into the replies
    os.dup2(log, 2)
    multiprocessing.set_forkserver_preload([*spawn._PRELOAD, spawn.FORKED])
    multiprocessing.forkserver.ensure_running()
    gc.freeze()  # as launch()'s fork server does (communicator.testing.forked): for the scripts forked here
    own = {p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    base_path = [p for p in sys.path[1:] if p not in own]  # what any interpreter has: stdlib, site
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os._exit(_child(request, base_path))
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"code": os.waitstatus_to_exitcode(status)}) + "\n")


def _child(request: dict[str, Any], base_path: list[str]) -> int:
    import multiprocessing.forkserver
    import multiprocessing.process

    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        # Appending: a torchrun job's workers share the files without overwriting each other.
        os.dup2(os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644), 1)
        os.dup2(os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644), 2)
        script = request["argv"][0]
        extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.argv = list(request["argv"])
        sys.path[:] = [os.path.dirname(os.path.abspath(script)), *extra, *base_path]
        # The server's fork server is alive as long as the server is; it is not this child's own
        # child, so its check (a waitpid) would fail here.
        multiprocessing.forkserver._forkserver.ensure_running = lambda: None  # type: ignore[method-assign]
        multiprocessing.process.ORIGINAL_DIR = request["cwd"]  # type: ignore[attr-defined]
        if request["torchrun"]:
            code = _agent(request["torchrun"], os.path.abspath(script))
        else:
            code = _run(os.path.abspath(script))  # __main__.__file__ is absolute, as python makes it
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def _agent(nproc: int, script: str) -> int:
    """torchrun's agent on one node: the job's store and ``nproc`` workers; 1 if any failed."""
    import signal

    from torch.distributed import TCPStore

    port = int(os.environ["MASTER_PORT"])
    workers = []
    for rank in range(nproc):
        pid = os.fork()  # before the store's threads start
        if pid == 0:
            os.environ.update(_worker_variables(rank, nproc))
            os._exit(_run(script))
        workers.append(pid)
    store = TCPStore("127.0.0.1", port, nproc, True, wait_for_workers=False)
    codes: dict[int, int] = {}
    while len(codes) < nproc:
        pid, status = os.wait()
        codes[pid] = os.waitstatus_to_exitcode(status)
        if codes[pid] != 0 and len([code for code in codes.values() if code != 0]) == 1:
            print(f"torchrun: rank {workers.index(pid)} failed first (exit code {codes[pid]})", file=sys.stderr)
            for other in set(workers) - set(codes):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(other, signal.SIGTERM)
    del store
    return 1 if any(codes.values()) else 0  # torchrun's own status when a worker failed


def _worker_variables(rank: int, nproc: int) -> dict[str, str]:
    """What torchrun's agent sets for worker ``rank`` of a one-node job (``--nproc-per-node nproc``)."""
    ranks = {"RANK": rank, "LOCAL_RANK": rank, "ROLE_RANK": rank, "GROUP_RANK": 0}
    sizes = {"WORLD_SIZE": nproc, "LOCAL_WORLD_SIZE": nproc, "ROLE_WORLD_SIZE": nproc, "GROUP_WORLD_SIZE": 1}
    return {
        **{name: str(value) for name, value in {**ranks, **sizes}.items()},
        "MASTER_ADDR": "127.0.0.1",
        "ROLE_NAME": "default",
        "TORCHELASTIC_RUN_ID": "none",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }


def _run(script: str) -> int:
    """What the interpreter does with ``python SCRIPT``: its exit status, a traceback on error."""
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exit:
        if exit.code is None or isinstance(exit.code, int):
            code = exit.code or 0
        else:
            print(exit.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - the interpreter reports any error and exits 1
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    return code


if __name__ == "__main__":
    serve()
