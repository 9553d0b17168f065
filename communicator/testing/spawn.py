"""`launch`: run a function on N local ranks (gloo on 127.0.0.1, or a registered transport) and get every
rank's return value."""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import pathlib
import pickle
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from communicator.base import Communicator
from communicator.config import CommConfig, ConfigLike
from communicator.errors import CommTimeoutError, ConfigError, RemoteError, RemoteFailure
from communicator.factory import check_hook
from communicator.launchers import launcher_variables
from communicator.launchers.local import free_port, reserve_port

__all__ = ["free_port", "launch"]

# After one rank fails, the others get this long to notice (through the failure board) and report.
GRACE_SECONDS = 5.0
_PRELOAD = ["torch", "numpy", "communicator"]
FORKED = "communicator.testing.forked"  # last in a fork server: what it imported is frozen for its ranks


@dataclass
class _Outcome:
    ok: bool
    value: Any = None
    failure: RemoteFailure | None = None


def _rank_main(
    fn: Callable[..., Any],
    rank: int,
    nproc: int,
    port: int,
    cfg: CommConfig,
    args: Sequence[Any],
    conn: mpc.Connection,
    env: Mapping[str, str],
    trace_path: str,
    registered: type[Communicator] | None,
) -> None:
    # The ranks form a job of their own, also when launch() runs inside a torchrun, srun or mpirun
    # rank: nothing of the enclosing job's launcher may reach them (see launcher_variables).
    for name in launcher_variables(os.environ):
        del os.environ[name]
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(nproc),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(nproc),
            "GROUP_RANK": "0",
        }
    )
    os.environ.update(env)
    # Local ranks share this machine's cores: without this each would start one thread per core.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // nproc))
    trace_file = open(trace_path, "w")  # noqa: SIM115 - must stay open for faulthandler
    faulthandler.register(signal.SIGUSR1, file=trace_file, all_threads=True)
    try:
        if cfg.type is not None and registered is not None:
            # Unpickling the class imported its module; registering again covers a class registered
            # elsewhere than at its module's import.
            Communicator.register(cfg.type)(registered)
        with Communicator.create(cfg) as comm:
            result = fn(comm, *args)
        # Plain pickle: multiprocessing's would share tensors through file descriptors that die with this process.
        conn.send_bytes(pickle.dumps(_Outcome(True, result)))
    except BaseException as error:  # noqa: BLE001 - every failure is reported to the parent
        failure = RemoteFailure.of(rank, error, error.context if isinstance(error, RemoteError) else "")
        conn.send_bytes(pickle.dumps(_Outcome(False, failure=failure)))
    finally:
        conn.close()
        trace_file.close()


_MAIN_GUARD = (
    "each rank imports the script that called launch(); in a script, call launch() under "
    '`if __name__ == "__main__":` so that importing it does not start ranks again'
)


def _refuse_rank_bootstrap() -> None:
    """A rank importing a script without a main guard would start ranks of its own: say the rule."""
    # multiprocessing marks a child that is still importing the parent's main module this way.
    if getattr(mp.current_process(), "_inheriting", False):
        script = getattr(sys.modules.get("__mp_main__"), "__file__", None) or "the script"
        raise RuntimeError(f"launch() was called while a rank was importing {script}: {_MAIN_GUARD}")


def _check_sendable(fn: Callable[..., Any], args: Sequence[Any]) -> None:
    """Ranks receive ``fn`` by reference (module and name) and ``args`` pickled: refuse what cannot travel."""
    try:
        pickle.dumps(fn)
    except Exception as error:  # noqa: BLE001 - any pickling failure means the same rule was broken
        raise TypeError(
            f"launch() needs a function defined at the top level of a module, so that each rank can import "
            f"it by name; {getattr(fn, '__qualname__', fn)!r} is not one (a lambda, a nested function or a "
            f"method of a local class cannot be sent): {error}"
        ) from None
    main = sys.modules.get("__main__")
    if getattr(fn, "__module__", None) == "__main__" and not getattr(main, "__file__", None):
        raise TypeError(
            f"launch() needs a function that each rank can import; {getattr(fn, '__qualname__', fn)!r} was defined "
            "in an interactive session or with python -c, which the ranks cannot import: define it in a file"
        )
    try:
        pickle.dumps(tuple(args))
    except Exception as error:  # noqa: BLE001
        raise TypeError(f"launch(): args must be picklable to reach the ranks: {error}") from None


def _registered_class(config: CommConfig) -> type[Communicator] | None:
    """The class ``config.type`` names, checked here so that a misuse fails before any rank starts."""
    if config.type is None:
        return None
    registered = Communicator.registered()
    if config.type not in registered:
        raise ConfigError(
            f"launch(): type={config.type!r} is not registered in this process (registered: {sorted(registered)}); "
            "import the module that registers it before calling launch()"
        )
    cls = registered[config.type]
    check_hook(cls)
    try:
        pickle.dumps(cls)
    except Exception as error:  # noqa: BLE001 - any pickling failure means the class cannot be imported by name
        raise ConfigError(
            f"launch(): type={config.type!r} is {cls.__qualname__}, which the ranks cannot import by name; "
            f"define it at the top level of a module: {error}"
        ) from None
    return cls


def _ranks_env(env: Mapping[str, str] | Callable[[int], Mapping[str, str]] | None, rank: int) -> dict[str, str]:
    if env is None:
        return {}
    return dict(env(rank) if callable(env) else env)


def launch(
    fn: Callable[..., Any],
    nproc: int,
    cfg: ConfigLike = None,
    args: Sequence[Any] = (),
    *,
    timeout: float | None = None,
    env: Mapping[str, str] | Callable[[int], Mapping[str, str]] | None = None,
    start_method: str = "forkserver",
    on_failure: Literal["stop", "continue"] = "stop",
) -> list[Any]:
    """Run ``fn(comm, *args)`` on ``nproc`` local processes; return each rank's result in rank order.

    Each process gets torchrun's variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``, a
    free ``MASTER_PORT``, ...) plus ``env`` (a mapping, or a function of the rank), and runs ``fn``
    inside ``Communicator.create(cfg)``. ``cfg=None`` means ``{"backend": "gloo"}``; a ``cfg`` naming a
    registered ``type`` builds that class on every rank (registered there too, by importing the
    class's module), with nothing of gloo's forced on it. Called in a
    rank of a launched job (torchrun, ``srun``, ``mpirun``), it starts a job of its own: the
    launchers' variables of the caller's environment (``TORCHELASTIC_*``, ``SLURM_*``, ``OMPI_*``, ...;
    see :func:`communicator.launchers.launcher_variables`) do not reach the new ranks.

    Raises:
        ConfigError: before any rank starts: ``cfg`` names a type that is not registered here, a
            class the ranks cannot import, or one whose ``from_launcher`` is not a classmethod.
        RemoteError: a rank raised or died; it names the rank, its error and its traceback. The
            other ranks are released through the failure board and stopped after a short grace.
            With ``on_failure="continue"`` nothing is raised for it: the other ranks run on (the
            survivors may ``shrink()``), and a rank that raised or died gives its
            :class:`~communicator.errors.RemoteFailure` in its place in the results.
        CommTimeoutError: ``timeout`` (seconds) passed; the message holds every rank's stack.

    Example:
        ```python
        def work(comm):
            return comm.all_reduce(torch.tensor([comm.rank])).item()

        launch(work, 2)   # [1, 1]
        ```
    """
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ConfigError(f"nproc={nproc!r} is invalid: expected a positive int")
    if on_failure not in ("stop", "continue"):
        raise ConfigError(f"on_failure={on_failure!r} is invalid: expected 'stop' or 'continue'")
    _refuse_rank_bootstrap()
    _check_sendable(fn, args)
    config = CommConfig.of(cfg if cfg is not None else {"backend": "gloo"})
    if config.launcher not in ("auto", "pytorch"):
        raise ConfigError(f"launch() starts torchrun-style ranks; launcher={config.launcher!r} cannot apply")
    registered = _registered_class(config)
    ctx: Any = mp.get_context(start_method)
    if start_method == "forkserver":
        # Modules the ranks need anyway are imported once, in the fork server; pytest too when the
        # caller runs under it, since ranks unpickle test functions by importing their module.
        ctx.set_forkserver_preload(_PRELOAD + [m for m in ("pytest",) if m in sys.modules] + [FORKED])
    held = reserve_port()  # until the job ends: another launch() on this machine cannot choose it
    port = held.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="communicator-launch-")
    processes: list[mp.process.BaseProcess] = []
    connections: list[mpc.Connection] = []
    try:
        for rank in range(nproc):
            parent_end, child_end = ctx.Pipe(duplex=False)
            process = ctx.Process(
                target=_rank_main,
                args=(
                    fn,
                    rank,
                    nproc,
                    port,
                    config,
                    tuple(args),
                    child_end,
                    _ranks_env(env, rank),
                    os.path.join(workdir, f"rank{rank}.trace"),
                    registered,
                ),
                name=f"communicator-rank{rank}",
                daemon=True,
            )
            process.start()
            child_end.close()
            processes.append(process)
            connections.append(parent_end)
        outcomes = _collect(processes, connections, timeout, workdir, on_failure == "stop")
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
        for process in processes:
            process.join(5)
        for conn in connections:
            conn.close()
        held.close()
        shutil.rmtree(workdir, ignore_errors=True)
    failures = [o.failure for o in outcomes if o.failure is not None]
    if on_failure == "continue":
        return [o.value if o.failure is None else o.failure for o in outcomes]
    if failures:
        raise _launch_error(failures)
    return [o.value for o in outcomes]


def _collect(
    processes: list[mp.process.BaseProcess],
    connections: list[mpc.Connection],
    timeout: float | None,
    workdir: str,
    stop_on_failure: bool,
) -> list[_Outcome]:
    outcomes: dict[int, _Outcome] = {}
    deadline = None if timeout is None else time.monotonic() + timeout
    failed_at: float | None = None
    while len(outcomes) < len(processes):
        pending = [r for r in range(len(processes)) if r not in outcomes]
        now = time.monotonic()
        if failed_at is not None and now - failed_at > GRACE_SECONDS:
            for r in pending:
                processes[r].kill()
                outcomes[r] = _Outcome(
                    False, failure=RemoteFailure(r, "Stopped", f"stopped {GRACE_SECONDS:g} s after another rank failed")
                )
            break
        if deadline is not None and now > deadline:
            raise _timeout_error(processes, pending, workdir, timeout or 0.0)
        waits = [t for t in (deadline, None if failed_at is None else failed_at + GRACE_SECONDS) if t is not None]
        wait_for = max(0.0, min(waits) - now) if waits else None
        objects: list[Any] = [connections[r] for r in pending] + [processes[r].sentinel for r in pending]
        ready = mpc.wait(objects, timeout=wait_for)
        for r in pending:
            if connections[r] in ready or processes[r].sentinel in ready:
                outcome = _receive(processes[r], connections[r], r, os.path.join(workdir, f"rank{r}.trace"))
                if outcome is not None:
                    outcomes[r] = outcome
                    if not outcome.ok and failed_at is None and stop_on_failure:
                        failed_at = time.monotonic()
    return [outcomes[r] for r in range(len(processes))]


def _receive(process: mp.process.BaseProcess, conn: mpc.Connection, rank: int, trace_path: str) -> _Outcome | None:
    try:
        if conn.poll():
            outcome: _Outcome = pickle.loads(conn.recv_bytes())
            return outcome
    except (EOFError, OSError):
        pass
    process.join(1)
    if process.exitcode is None:
        return None
    code = process.exitcode
    how = f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    message = f"the rank's process {how} without reporting"
    if not os.path.exists(trace_path):  # the rank never reached its function: it failed while starting
        message += f" while starting, before running the function (see its error output); a common cause: {_MAIN_GUARD}"
    return _Outcome(False, failure=RemoteFailure(rank, "ProcessDied", message))


def _launch_error(failures: list[RemoteFailure]) -> RemoteError:
    # Ranks that only reacted to another rank's failure are consequences; report the causes first.
    consequences = ("RemoteError", "PeerLostError", "Stopped")
    causes = [f for f in failures if f.error_type not in consequences] or failures
    error = RemoteError(causes, context="launch")
    error.add_note("".join(f"\n--- rank {f.rank} traceback ---\n{f.traceback}" for f in causes if f.traceback))
    return error


def _timeout_error(
    processes: list[mp.process.BaseProcess], pending: list[int], workdir: str, timeout: float
) -> CommTimeoutError:
    for r in pending:
        pid = processes[r].pid
        if pid is not None and processes[r].is_alive():
            os.kill(pid, signal.SIGUSR1)  # faulthandler writes every thread's stack
    time.sleep(0.5)
    stacks = []
    for r in pending:
        path = os.path.join(workdir, f"rank{r}.trace")
        text = pathlib.Path(path).read_text() if os.path.exists(path) else ""
        stacks.append(f"--- rank {r} ---\n{text.strip() or '(no stack dumped)'}")
    print("\n".join(stacks), file=sys.stderr)
    return CommTimeoutError(
        f"ranks {pending} did not finish within {timeout:g} s; their stacks:\n" + "\n".join(stacks),
        missing_ranks=pending,
    )
