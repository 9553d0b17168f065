"""Run torch's own distributed test suite over the ``"communicator"`` backend.

torch ships ``DistributedTest._DistTestBase`` (``torch.testing._internal.distributed.distributed_test``),
the suite its ``test/distributed/test_distributed_spawn.py`` runs once per backend: each test starts
``WORLD_SIZE`` rank processes that call ``init_process_group(backend=BACKEND)`` and run its body,
while the parent waits for them (at most a timeout) and reads their exit codes. This script runs it
with ``BACKEND=communicator``: each rank's default group is the communicator's ``CommProcessGroup``
over gloo. It prints each test's outcome and the counts, and the cause of each known failure::

    python tests/transports/torch_suite_driver.py                  # the whole applicable set, 2 ranks
    python tests/transports/torch_suite_driver.py --world-size 3
    python tests/transports/torch_suite_driver.py --quick          # the subset pytest runs every time
    python tests/transports/torch_suite_driver.py test_broadcast 'test_all_reduce_*'
    python tests/transports/torch_suite_driver.py --list           # what would run; what is skipped, and why

torch's suite chooses its tests by backend name, in two ways, settled when it is imported:

* ``DistTestCases`` (``common_distributed``) lists the backends that have a feature (``ddp``,
  ``subgroup``, ``gpu`` ...) or lack a collective. ``communicator`` joins every list gloo is in,
  ``plugin`` (a backend registered from outside torch) and ``skip_collective["sendrecv anysource"]``
  (its group refuses a receive from any source).
* Some tests are gated on the name itself (``BACKEND != "gloo"``, ``require_backend_is_available({"gloo"})``).
  The parent imports the suite a second time with ``BACKEND=gloo`` (and gloo in ``DistTestCases``
  exactly where ``communicator`` is): a test that only the name skips is run, unless
  ``NOT_APPLICABLE`` says why the backend cannot honestly claim it.

Ranks start from a forkserver that imported torch's suite once (``--start-method spawn`` starts each
rank as torch's driver does: a new interpreter importing everything, seconds per test). Every test is
bounded (``--timeout``, default 60 s: its ranks are killed then, and their groups time out before),
and so is the run (``--deadline``: tests not started by then are reported as not run). ``--json FILE``
writes every test's outcome, with each failure's traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import importlib.util
import json
import os
import re
import sys
import tempfile
import time
import types
import unittest
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: The backend name torch's suite runs with.
BACKEND = "communicator"
#: The variable that carries the per-test timeout (seconds) to the spawned ranks.
TIMEOUT_ENV = "COMMUNICATOR_TORCH_SUITE_TIMEOUT"
#: Set in the parent before any rank starts: importing this module (as ``MODULE``) then prepares the process.
RANKS_ENV = "COMMUNICATOR_TORCH_SUITE_RANKS"
#: The parent's ``sys.path`` (JSON), for the forkserver, which starts as ``python -c`` in the same folder.
SYS_PATH_ENV = "COMMUNICATOR_TORCH_SUITE_SYS_PATH"
MODULE = "torch_suite_driver"
#: How ranks start: "forkserver" (default: torch's suite is imported once) or "spawn" (as torch's driver).
START_METHOD_ENV = "COMMUNICATOR_TORCH_SUITE_START"
DEFAULT_TIMEOUT = 60.0
SUITE_MODULE = "torch.testing._internal.distributed.distributed_test"

#: A fast subset: each operation through the default group (the communicator's), DDP over it, and
#: torch's own checks of arguments, works, futures and timeouts. (The ``*_group`` and ``*_full_group``
#: tests use ``dist.new_group``, whose groups are plain gloo's under this backend: not here.)
QUICK = (
    "test_Backend_enum_class",
    "test_get_backend",
    "test_all_reduce_sum",
    "test_all_reduce_max",
    "test_all_reduce_product",
    "test_all_reduce_sum_complex",
    "test_all_reduce_sum_async",
    "test_all_reduce_complex_unsupported_ops",
    "test_all_reduce_coalesced_sum",
    "test_all_reduce_coalesced_max",
    "test_reduce_sum",
    "test_reduce_min",
    "test_broadcast",
    "test_all_gather",
    "test_all_gather_complex",
    "test_all_gather_object_default_pg",
    "test_gather",
    "test_gather_checks",
    "test_scatter",
    "test_scatter_checks",
    "test_scatter_object_list",
    "test_send_recv",
    "test_send_recv_with_tag",
    "test_isend",
    "test_irecv",
    "test_batch_isend_irecv_gloo",
    "test_barrier",
    "test_barrier_timeout_global",
    "test_get_future",
    "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_DistributedDataParallelCPU",
    "test_static_graph_api_cpu",
    "test_ddp_logging_data_cpu",
)

#: Tests gloo runs that this backend does not claim, and why (reported as skipped, with the reason).
NOT_APPLICABLE = {
    **dict.fromkeys(
        ("test_sparse_all_reduce_sum", "test_sparse_all_reduce_sum_cuda"),
        "sparse tensors: the communicator takes dense (strided) tensors only (TypeError from its "
        "argument check); gloo all-reduces sparse COO tensors",
    ),
    **dict.fromkeys(
        (
            "test_monitored_barrier_gloo",
            "test_monitored_barrier_gloo_subgroup",
            "test_monitored_barrier_failure_order",
            "test_monitored_barrier_wait_all_ranks",
        ),
        "torch's dist.monitored_barrier() refuses a group whose backend name is not 'gloo' (ValueError), "
        "new_group's gloo groups under this backend included; the group's own pg.monitored_barrier() is "
        "the communicator's (docs/ddp.md)",
    ),
}

#: Tests whose body picks its CPU model by ``BACKEND == "gloo"`` (else builds none, for a backend
#: name it does not know): their ranks read ``BACKEND`` as ``"gloo"`` once the default group (the
#: communicator's) is up, so the body takes the CPU branch; nothing else in them reads the name.
GLOO_BRANCH = frozenset(
    {
        "test_accumulate_gradients_no_sync",
        "test_accumulate_gradients_no_sync_grad_is_view",
        "test_accumulate_gradients_no_sync_allreduce_hook",
        "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
    }
)

#: Known failures: test name (or fnmatch pattern) -> its cause, printed beside the failure. A
#: failure not named here is reported as unknown (and fails pytest's full run).
KNOWN_FAILURES: dict[str, str] = {}


# -- preparing a process: the parent and every spawned rank -------------------------------------------


def _install_expecttest_stand_in() -> None:
    """torch's ``common_utils`` imports ``expecttest`` (a torch test dependency, not ours) for its
    ``TestCase`` base and its ``ACCEPT`` flag; the distributed suite uses neither's expect-file
    checks, so without the package a minimal module stands in."""
    try:
        import expecttest  # noqa: F401
    except ImportError:
        stand_in = types.ModuleType("expecttest")
        stand_in.TestCase = unittest.TestCase  # type: ignore[attr-defined]
        stand_in.ACCEPT = False  # type: ignore[attr-defined]
        sys.modules["expecttest"] = stand_in


def _extend_backend_tables(tables: Any) -> None:
    """``communicator`` in torch's per-backend tables: a backend registered from outside torch
    (``plugin``, which ``require_backend_is_available`` takes as available), with gloo's features,
    and among the backends that refuse a receive from any source."""
    for backends in tables.backend_feature.values():
        if "gloo" in backends:
            backends.add(BACKEND)
    tables.backend_feature["plugin"].add(BACKEND)
    tables.skip_collective["sendrecv anysource"].add(BACKEND)


@contextlib.contextmanager
def _gloo_as_communicator(tables: Any) -> Iterator[None]:
    """For a while, gloo in ``tables`` exactly where ``communicator`` is."""
    sets = [*tables.backend_feature.values(), *tables.skip_collective.values()]
    had = [("gloo" in backends) for backends in sets]
    for backends in sets:
        (backends.add if BACKEND in backends else backends.discard)("gloo")
    try:
        yield
    finally:
        for backends, present in zip(sets, had, strict=True):
            (backends.add if present else backends.discard)("gloo")


def _bound_timeouts(common_distributed: Any, suite: Any, seconds: float) -> None:
    """At most ``seconds`` for every test (the parent kills its ranks then), and groups whose
    operations time out a little before that (so a hung rank reports where it hung)."""
    common_distributed.TIMEOUT_DEFAULT = seconds
    common_distributed.TIMEOUT_OVERRIDE.clear()
    group_seconds = max(5, int(seconds * 0.75))
    suite.default_pg_timeout = min(suite.default_pg_timeout, group_seconds)
    for name, value in list(suite.CUSTOM_PG_TIMEOUT.items()):
        suite.CUSTOM_PG_TIMEOUT[name] = min(value, group_seconds)


def load() -> type:
    """Import torch's suite for this backend and define ``TestCommunicatorBackend`` (in this module's
    globals, where the spawned ranks find it by name)."""
    if SYS_PATH_ENV in os.environ:  # the parent's modules (its communicator), not the folder's
        sys.path[:] = json.loads(os.environ[SYS_PATH_ENV])
    os.environ["BACKEND"] = BACKEND
    os.environ.setdefault("WORLD_SIZE", "2")
    os.environ.setdefault("PYTORCH_PRINT_REPRO_ON_FAILURE", "0")
    # Only the name matters: TestDistBackend initialises every group from its own file. A file://
    # method lets the test that re-initialises the default group run (torch's runs do both kinds).
    os.environ.setdefault("INIT_METHOD", "file://" + os.path.join(tempfile.gettempdir(), "communicator-torch-suite"))
    _install_expecttest_stand_in()

    import torch.distributed as dist
    from torch.testing._internal import common_distributed

    import communicator  # noqa: F401 - registers the backend
    from communicator.transports.process_group import communicator_of

    _extend_backend_tables(common_distributed.DistTestCases)
    suite = importlib.import_module(SUITE_MODULE)
    _bound_timeouts(common_distributed, suite, float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT)))

    class TestCommunicatorBackend(suite.TestDistBackend, suite.DistributedTest._DistTestBase):  # type: ignore[misc,name-defined]
        """torch's distributed tests, each on ``WORLD_SIZE`` new ranks of the communicator backend."""

        def setUp(self) -> None:
            super().setUp()
            self._start_processes(_rank_process)

        def run_test(self, test_name: str, parent_pipe: Any) -> None:
            """A rank's test, once its default group is up: the communicator's (see also ``GLOO_BRANCH``)."""
            if communicator_of(None) is None:
                raise RuntimeError(f"torch's default group is not a communicator's: {dist.group.WORLD!r}")
            if test_name in GLOO_BRANCH:
                suite.BACKEND = "gloo"
            super().run_test(test_name, parent_pipe)

    TestCommunicatorBackend.__qualname__ = TestCommunicatorBackend.__name__
    globals()[TestCommunicatorBackend.__name__] = TestCommunicatorBackend
    return TestCommunicatorBackend


def _rank_process(target: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A rank's process, started as ``START_METHOD_ENV`` says. A forkserver's ranks are forked from a
    server that imported this file (and so torch's suite) once, with the server's environment:
    each gets the parent's, as a spawned rank would."""
    import torch.multiprocessing

    context = torch.multiprocessing.get_context(os.environ.get(START_METHOD_ENV, "forkserver"))
    return context.Process(target=_enter_rank, name=name, args=(target, dict(os.environ), *args), kwargs=kwargs)


def _enter_rank(target: Any, environ: dict[str, str], *args: Any, **kwargs: Any) -> None:
    """A rank's process: the parent's environment (the test's TEMP_DIR and INIT_METHOD), then torch's entry."""
    os.environ.update(environ)
    sys.modules[SUITE_MODULE].INIT_METHOD = environ["INIT_METHOD"]  # read at import, set per test
    target(*args, **kwargs)


# -- choosing the tests (the parent) ------------------------------------------------------------------


def _skip_reason(function: Any) -> str | None:
    return getattr(function, "__unittest_skip_why__", None) if getattr(function, "__unittest_skip__", False) else None


def _skips_as_gloo() -> dict[str, str | None]:
    """Each test's import-time skip reason when torch's suite is imported with ``BACKEND=gloo``
    (a second copy of the module, under another name) and gloo has ``communicator``'s entries in
    ``DistTestCases``: the tests skipped here and not in :func:`load`'s copy are gated on the name alone."""
    from torch.testing._internal.common_distributed import DistTestCases

    backend = "gloo"
    spec = importlib.util.find_spec(SUITE_MODULE)
    assert spec is not None and spec.origin is not None
    name = f"_communicator_torch_suite_as_{backend}"
    copy_spec = importlib.util.spec_from_file_location(name, spec.origin)
    assert copy_spec is not None and copy_spec.loader is not None
    module = importlib.util.module_from_spec(copy_spec)
    previous = os.environ["BACKEND"]
    os.environ["BACKEND"] = backend
    sys.modules[name] = module
    try:
        with _gloo_as_communicator(DistTestCases):
            copy_spec.loader.exec_module(module)
    finally:
        os.environ["BACKEND"] = previous
        del sys.modules[name]
    base = module.DistributedTest._DistTestBase
    return {test: _skip_reason(getattr(base, test)) for test in dir(base) if test.startswith("test")}


def _clear_skip(function: Any) -> None:
    """Remove an import-time skip from ``function`` and every function it wraps (functools.wraps
    copies the mark outwards)."""
    while function is not None:
        for mark in ("__unittest_skip__", "__unittest_skip_why__"):
            if mark in getattr(function, "__dict__", {}):
                delattr(function, mark)
        function = getattr(function, "__wrapped__", None)


def plan(cls: type) -> tuple[dict[str, str | None], list[str]]:
    """Every test of the suite and why it does not run (``None``: it runs), and the tests that run
    because only a gate on gloo's name skipped them (unless ``NOT_APPLICABLE`` names them)."""
    as_gloo = _skips_as_gloo()
    tests: dict[str, str | None] = {}
    lifted: list[str] = []
    for name in sorted(n for n in dir(cls) if n.startswith("test")):
        function = getattr(cls, name)
        reason = _skip_reason(function)
        if name in NOT_APPLICABLE:
            reason = f"not applicable to {BACKEND}: {NOT_APPLICABLE[name]}"
        elif reason is not None and name in as_gloo and as_gloo[name] is None:
            _clear_skip(function)  # gated on gloo's name only: gloo's feature set applies
            reason = None
            lifted.append(name)
        tests[name] = reason
    return tests, lifted


def known_failure(name: str) -> str | None:
    for pattern, cause in KNOWN_FAILURES.items():
        if fnmatch.fnmatchcase(name, pattern):
            return cause
    return None


# -- running them ---------------------------------------------------------------------------------------


_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Timeout\w*)|AssertionError)(:|$)")


def _summary(text: str) -> str:
    """The line of a failure that says what went wrong: the last exception a rank raised (the
    parent's own ``RuntimeError: Process N exited ...`` only wraps it), else the parent's message."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    raised = [line for line in lines if _EXCEPTION_LINE.match(line) and not line.startswith("RuntimeError: Process ")]
    chosen = raised[-1] if raised else next((line for line in reversed(lines) if _EXCEPTION_LINE.match(line)), "")
    return (chosen or (lines[-1] if lines else ""))[:400]


class Recorder(unittest.TestResult):
    """Each test's outcome, printed as it ends; no test starts after the deadline."""

    def __init__(self, deadline: float) -> None:
        super().__init__()
        self.deadline = deadline
        self.outcomes: dict[str, dict[str, Any]] = {}
        self._started = 0.0

    def startTest(self, test: unittest.TestCase) -> None:
        super().startTest(test)
        self._started = time.monotonic()

    def stopTest(self, test: unittest.TestCase) -> None:
        super().stopTest(test)
        if time.monotonic() > self.deadline:
            self.stop()  # the suite starts no further test

    def _record(self, test: unittest.TestCase, outcome: str, detail: str = "") -> None:
        name = test.id().rsplit(".", 1)[-1]
        seconds = round(time.monotonic() - self._started, 1)
        entry: dict[str, Any] = {"outcome": outcome, "seconds": seconds}
        if outcome == "failed":
            entry["error"] = _summary(detail)
            entry["detail"] = detail[-6000:]
            entry["known"] = known_failure(name)
        elif outcome == "skipped":
            entry["reason"] = detail
        self.outcomes[name] = entry
        shown = entry.get("error") or entry.get("reason") or ""
        print(f"[torch-suite] {outcome.upper():7} {name} ({seconds} s) {shown}", flush=True)

    def addSuccess(self, test: unittest.TestCase) -> None:
        super().addSuccess(test)
        self._record(test, "passed")

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)

    def addError(self, test: unittest.TestCase, err: Any) -> None:
        super().addError(test, err)
        self._record(test, "failed", self.errors[-1][1])

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addFailure(test, err)
        self._record(test, "failed", self.failures[-1][1])

    def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addExpectedFailure(test, err)
        self._record(test, "passed")

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
        super().addUnexpectedSuccess(test)
        self._record(test, "failed", "unexpected success")


def run(cls: type, names: list[str], deadline_seconds: float) -> dict[str, dict[str, Any]]:
    suite = unittest.TestSuite(cls(name) for name in names)
    recorder = Recorder(time.monotonic() + deadline_seconds)
    suite.run(recorder)
    for name in names:
        recorder.outcomes.setdefault(name, {"outcome": "not run", "reason": "the run's deadline passed"})
    return recorder.outcomes


def report(outcomes: dict[str, dict[str, Any]], left_out: dict[str, str]) -> dict[str, Any]:
    counts = Counter(entry["outcome"] for entry in outcomes.values())
    counts["skipped"] += len(left_out)
    failures = {name: entry for name, entry in outcomes.items() if entry["outcome"] == "failed"}
    print(f"\n[torch-suite] backend {BACKEND}, world size {os.environ['WORLD_SIZE']}")
    for name, entry in sorted(failures.items()):
        print(f"[torch-suite] FAILED {name}: {entry['error']}")
        print(f"[torch-suite]     cause: {entry['known'] or 'UNKNOWN (not in KNOWN_FAILURES)'}")
    line = f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
    if counts["not run"]:
        line += f", {counts['not run']} not run (deadline)"
    print(f"[torch-suite] {line}")
    return {"counts": dict(counts), "summary": line}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tests", nargs="*", help="names or fnmatch patterns (default: every applicable test)")
    parser.add_argument("--quick", action="store_true", help="the curated subset (QUICK)")
    parser.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", "2")))
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per test")
    parser.add_argument("--deadline", type=float, default=3 * 3600, help="seconds for the whole run")
    parser.add_argument(
        "--start-method",
        choices=("forkserver", "spawn"),
        default="forkserver",
        help="forkserver: ranks fork from a server that imported torch's suite once; spawn: as torch does",
    )
    parser.add_argument("--json", type=Path, help="write every test's outcome here")
    parser.add_argument("--list", action="store_true", help="print the plan, run nothing")
    args = parser.parse_args(argv)

    os.environ["WORLD_SIZE"] = str(args.world_size)
    os.environ[TIMEOUT_ENV] = str(args.timeout)
    os.environ[START_METHOD_ENV] = args.start_method
    os.environ[RANKS_ENV] = "1"
    os.environ[SYS_PATH_ENV] = json.dumps(sys.path)
    if args.start_method == "forkserver":
        import multiprocessing

        from communicator.testing.spawn import FORKED

        # The server starts as `python -c` and does not take the parent's sys.path (CPython 3.11 drops
        # it): it finds this module through PYTHONPATH, or silently preloads nothing (each rank then
        # imports torch's suite itself). load() then takes the parent's sys.path (SYS_PATH_ENV).
        paths = [str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")]
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        multiprocessing.get_context("forkserver").set_forkserver_preload([MODULE, FORKED])
    cls = load()
    tests, lifted = plan(cls)
    patterns = list(QUICK) if args.quick else args.tests
    if patterns:
        unknown = [p for p in patterns if not any(fnmatch.fnmatchcase(t, p) for t in tests)]
        if unknown:
            parser.error(f"no such test: {', '.join(unknown)}")
        tests = {t: r for t, r in tests.items() if any(fnmatch.fnmatchcase(t, p) for p in patterns)}
    runnable = [t for t, reason in tests.items() if reason is None]
    left_out = {t: reason for t, reason in tests.items() if reason is not None}
    if args.list:
        for name, reason in tests.items():
            what = "skip" if reason else "run*" if name in lifted else "run "
            print(f"{what} {name}" + (f"  ({reason})" if reason else ""))
        print(f"{len(runnable)} to run ({len(lifted)} run* only gated on gloo's name), {len(left_out)} skipped")
        return 0

    print(f"[torch-suite] {len(runnable)} tests to run, {len(left_out)} skipped before they start", flush=True)
    outcomes = run(cls, runnable, args.deadline)
    for name, reason in left_out.items():
        outcomes[name] = {"outcome": "skipped", "reason": reason, "seconds": 0.0}
    result = report({t: o for t, o in outcomes.items() if t not in left_out}, left_out)
    if args.json:
        result.update(world_size=args.world_size, backend=BACKEND, tests=outcomes, lifted=lifted)
        args.json.write_text(json.dumps(result, indent=1, sort_keys=True))
    return 1 if result["counts"].get("failed") or result["counts"].get("not run") else 0


if os.environ.get(RANKS_ENV) and __name__ == MODULE:
    load()  # a rank's process, or the forkserver its process forks from: prepared as the parent is

if __name__ == "__main__":  # everything lives in the module of that name, where the ranks look
    sys.exit(importlib.import_module(MODULE).main())
