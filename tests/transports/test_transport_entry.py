"""A registered transport of one's own: ``create`` builds it through its ``from_launcher`` hook with the
launcher's view of the process, ``launch`` starts ranks of it, and misuse is a ``ConfigError`` first."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, Self

import pytest
import torch
import torch.distributed as dist
from typing_extensions import override

import communicator.factory as factory
from communicator import CommConfig, Communicator, ConfigError, RemoteError, launch
from communicator.factory import decide
from communicator.handles import Work
from communicator.launchers import LauncherEnv, launcher_variables
from communicator.testing.spawn import free_port

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "examples"))
from socket_comm import SocketComm  # noqa: E402 - after the examples' folder is on the path

LIMIT = 90  # seconds a launch may take before its ranks' stacks are reported


@Communicator.register("recording-socket")
class RecordingSocket(SocketComm):
    """The example's transport, keeping what its hook was given."""

    seen: dict[str, Any]

    @classmethod
    @override
    def from_launcher(cls, config: CommConfig, launcher: LauncherEnv) -> Self:
        comm = super().from_launcher(config, launcher)
        comm.seen = {
            "launcher": launcher.name,
            "rank": launcher.rank,
            "world": launcher.world_size,
            "addr": launcher.master_addr,
            "port": launcher.master_port,
        }
        return comm


@Communicator.register("single-by-config")
class SingleByConfig(Communicator):
    """No hook: built as ``cls(config)``, a world of one in each process whatever the launcher says."""

    @property
    @override
    def rank(self) -> int:
        return 0

    @property
    @override
    def world_size(self) -> int:
        return 1

    @override
    def _isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        raise RuntimeError("a world of one has no peer")

    @override
    def _irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        raise RuntimeError("a world of one has no peer")


class RegisteredLate(SingleByConfig):
    """Registered by a test, not when this module is imported."""


@Communicator.register("unreachable")
class Unreachable(SingleByConfig):
    """A hook that must not run: the configuration or the launcher variables are wrong."""

    @classmethod
    def from_launcher(cls, config: CommConfig, launcher: LauncherEnv) -> Self:
        raise AssertionError("from_launcher ran although the launcher could not be read")


class NotAClassmethod(SingleByConfig):
    def from_launcher(self, config: CommConfig, launcher: LauncherEnv) -> None:
        raise AssertionError("never called")


class AStaticmethod(SingleByConfig):
    @staticmethod
    def from_launcher(config: CommConfig, launcher: LauncherEnv) -> None:
        raise AssertionError("never called")


@pytest.fixture
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in launcher_variables():
        monkeypatch.delenv(name)


@pytest.fixture
def registry() -> Iterator[None]:
    """Registrations made by the test are forgotten after it."""
    saved = dict(factory.REGISTRY)
    yield
    factory.REGISTRY.clear()
    factory.REGISTRY.update(saved)


def probe(comm: Communicator, base: int) -> dict[str, Any]:
    assert isinstance(comm, RecordingSocket)
    return {
        "class": type(comm).__name__,
        "rank": comm.rank,
        "world": comm.world_size,
        "seen": comm.seen,
        "env_port": int(os.environ["MASTER_PORT"]),
        "total": comm.all_reduce(torch.tensor([float(base + comm.rank)])).item(),
        "gathered": comm.all_gather_object(10 * comm.rank),
        "distributed": comm.is_distributed,
        "torch_group": dist.is_initialized(),
    }


@pytest.mark.timeout(LIMIT + 30)
@pytest.mark.parametrize("world", [2, 3])
def test_launch_builds_a_registered_transport_from_the_launcher(world: int) -> None:
    results = launch(probe, world, {"type": "recording-socket", "timeout": 30}, (100,), timeout=LIMIT)
    port = results[0]["env_port"]
    for rank, result in enumerate(results):
        seen = {"launcher": "pytorch", "rank": rank, "world": world, "addr": "127.0.0.1", "port": port}
        assert result == {
            "class": "RecordingSocket",
            "rank": rank,
            "world": world,
            "seen": seen,
            "env_port": port,
            "total": float(sum(100 + r for r in range(world))),
            "gathered": [10 * r for r in range(world)],
            "distributed": True,
            "torch_group": False,  # no gloo group: the transport is all there is
        }


@pytest.mark.timeout(LIMIT + 30)
def test_the_configured_master_port_reaches_the_hook() -> None:
    port = free_port()
    results = launch(probe, 2, {"type": "recording-socket", "timeout": 30, "master_port": port}, (0,), timeout=LIMIT)
    assert [r["seen"]["port"] for r in results] == [port, port]
    assert [r["total"] for r in results] == [1.0, 1.0]


def fail_last(comm: Communicator) -> str:
    if comm.rank == comm.world_size - 1:
        raise ValueError("the last rank fails")
    comm.barrier()
    return "passed the barrier"


@pytest.mark.timeout(LIMIT + 30)
def test_a_rank_that_raises_is_reported_by_name() -> None:
    with pytest.raises(RemoteError, match="the last rank fails") as caught:
        launch(fail_last, 3, {"type": "socket", "timeout": 30}, timeout=LIMIT)
    assert 2 in caught.value.ranks


def by_config(comm: Communicator) -> tuple[str, int, Any, str]:
    return type(comm).__name__, comm.world_size, comm.config.options["label"], os.environ["RANK"]


@pytest.mark.timeout(LIMIT + 30)
def test_a_registered_type_without_the_hook_is_built_from_its_config() -> None:
    cfg = {"type": "single-by-config", "options": {"label": "mine"}}
    results = launch(by_config, 2, cfg, timeout=LIMIT)
    assert results == [("SingleByConfig", 1, "mine", "0"), ("SingleByConfig", 1, "mine", "1")]


@pytest.mark.timeout(LIMIT + 30)
def test_launch_registers_the_class_on_every_rank(registry: None) -> None:
    Communicator.register("late")(RegisteredLate)
    results = launch(by_config, 2, {"type": "late", "options": {"label": "late"}}, timeout=LIMIT)
    assert results == [("RegisteredLate", 1, "late", "0"), ("RegisteredLate", 1, "late", "1")]


def test_without_the_hook_the_launcher_variables_are_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "not a rank")
    monkeypatch.setenv("WORLD_SIZE", "2")
    decision = decide(CommConfig(type="single-by-config"), Communicator.registered())
    assert decision.launcher is None and decision.reason == "the registered type 'single-by-config'"
    with Communicator.create({"type": "single-by-config"}) as comm:
        assert type(comm) is SingleByConfig and comm.world_size == 1


def test_the_decision_names_the_hook_and_the_launcher(monkeypatch: pytest.MonkeyPatch, no_launcher: None) -> None:
    for name, value in {"RANK": "1", "WORLD_SIZE": "3", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(name, value)
    decision = decide(CommConfig(type="recording-socket"), Communicator.registered())
    assert decision.launcher is not None
    assert (decision.launcher.rank, decision.launcher.world_size) == (1, 3)
    assert (decision.launcher.master_addr, decision.launcher.master_port) == ("10.1.2.3", 29999)
    assert "RecordingSocket.from_launcher from pytorch: rank 1 of 3" in decision.reason


@pytest.mark.timeout(60)
@pytest.mark.parametrize("launcher", ["auto", "none"])
def test_without_a_launcher_the_hook_builds_a_world_of_one(
    launcher: str, no_launcher: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if launcher == "none":  # launcher="none" ignores variables that are there
        monkeypatch.setenv("RANK", "1")
        monkeypatch.setenv("WORLD_SIZE", "2")
    with Communicator.create({"type": "recording-socket", "launcher": launcher, "timeout": 20}) as comm:
        assert isinstance(comm, RecordingSocket)
        assert (comm.seen["rank"], comm.seen["world"], comm.seen["addr"]) == (0, 1, "127.0.0.1")
        assert comm.all_reduce(torch.tensor([5.0])).item() == 5.0
        assert not comm.is_distributed and comm.config.timeout == timedelta(seconds=20)


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"RANK": "two", "WORLD_SIZE": "2"}, "RANK='two' is not an integer"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is out of range"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1"}, "MASTER_ADDR not set"),
    ],
)
def test_malformed_launcher_variables_fail_before_the_hook(
    variables: dict[str, str], message: str, no_launcher: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    if "MASTER_PORT" in variables:
        monkeypatch.delenv("MASTER_ADDR")
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=re.escape(message)):
        Communicator.create({"type": "unreachable"})


def test_a_forced_launcher_that_is_absent_fails_before_the_hook(no_launcher: None) -> None:
    with pytest.raises(ConfigError, match="SLURM_PROCID"):
        Communicator.create({"type": "unreachable", "launcher": "slurm"})


@pytest.mark.parametrize("cls", [NotAClassmethod, AStaticmethod])
def test_a_hook_that_is_not_a_classmethod_is_refused(cls: type[Communicator], registry: None) -> None:
    Communicator.register("misdeclared")(cls)
    kind = "function" if cls is NotAClassmethod else "staticmethod"
    expected = f"{cls.__qualname__}.from_launcher is a {kind}: define it as @classmethod"
    with pytest.raises(ConfigError, match=re.escape(expected)):
        Communicator.create({"type": "misdeclared"})
    with pytest.raises(ConfigError, match=re.escape(expected)):
        launch(by_config, 2, {"type": "misdeclared"}, timeout=LIMIT)


def test_launch_refuses_a_type_that_is_not_registered() -> None:
    with pytest.raises(ConfigError, match="type='nowhere' is not registered in this process"):
        launch(by_config, 2, {"type": "nowhere"}, timeout=LIMIT)


def test_launch_refuses_a_class_the_ranks_cannot_import(registry: None) -> None:
    @Communicator.register("local-class")
    class Local(SingleByConfig):
        pass

    with pytest.raises(ConfigError, match="Local, which the ranks cannot import by name"):
        launch(by_config, 2, {"type": "local-class"}, timeout=LIMIT)


@pytest.mark.timeout(180)
def test_the_socket_example_under_torchrun(tmp_path: Path) -> None:
    dropped = set(launcher_variables())
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("COMMUNICATOR_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "3"),
        *("--master-addr", "127.0.0.1", "--master-port", str(free_port())),
        str(ROOT / "docs" / "examples" / "socket_comm.py"),
    ]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    # The ranks share one pipe: a line may reach it without the newline before it.
    lines = sorted(re.findall(r"rank \d of 3: \(.*?\]\)", done.stdout))
    assert lines == [
        "rank 0 of 3: ('SocketComm', 3.0, [0, 1, 2], [0, 1])",
        "rank 1 of 3: ('SocketComm', 3.0, [0, 1, 2], [0, 1])",
        "rank 2 of 3: ('SocketComm', 3.0, [0, 1, 2], [2])",
    ]
