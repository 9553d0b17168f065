"""Communicator.create: which class, why, what it owns, and the registration hook."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
import torch.distributed as dist

from communicator import CommConfig, Communicator, ConfigError, NonDistComm, TorchComm
from communicator.testing import run_ranks


def test_no_launcher_gives_a_single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(name, raising=False)
    with Communicator.create() as comm:
        assert isinstance(comm, NonDistComm) and comm.world_size == 1
        assert "no launcher variables" in comm.describe()
        assert Communicator.current() is comm
    assert Communicator.current() is None and comm.closed


def test_launcher_none_wins_over_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with Communicator.create({"launcher": "none"}) as comm:
        assert isinstance(comm, NonDistComm) and "launcher='none'" in comm.describe()


def test_forced_launcher_without_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    with pytest.raises(ConfigError, match="SLURM_PROCID"):
        Communicator.create({"launcher": "slurm"})


def owned(comm: Communicator) -> dict[str, Any]:
    assert isinstance(comm, TorchComm)
    inside = {"initialised": dist.is_initialized(), "describe": comm.describe(), "backend": comm.backend}
    # third-party code calling torch.distributed inside the block works on the same group
    t = torch.ones(1)
    dist.all_reduce(t)
    inside["torch_sum"] = t.item()
    return inside


def test_launcher_variables_start_and_own_a_group() -> None:
    results = run_ranks(owned, 2)
    assert all(r["initialised"] and r["torch_sum"] == 2 and r["backend"] == "gloo" for r in results)
    assert "pytorch" in results[0]["describe"] and "initialised gloo" in results[0]["describe"]


def adopt(comm: Communicator) -> tuple[str, bool, str]:
    with Communicator.create() as inner:
        kind = type(inner).__name__
        why = inner.describe()
        inner.all_reduce(torch.ones(1))
    return kind, dist.is_initialized(), why  # the adopted group survives the inner block


def test_existing_group_is_adopted_not_destroyed() -> None:
    results = run_ranks(adopt, 2)
    assert all(r[0] == "TorchComm" and r[1] and "adopted" in r[2] for r in results)


def env_restored(comm: Communicator) -> tuple[str | None, str | None]:
    return os.environ.get("LOCAL_RANK"), os.environ.get("MASTER_ADDR")


def test_variables_set_for_the_block_are_restored() -> None:
    # launch() sets torchrun's variables before create(); create() only fills in what is missing
    assert run_ranks(env_restored, 2) == [("0", "127.0.0.1"), ("1", "127.0.0.1")]


def fails_on_rank_zero(comm: Communicator) -> str:
    if comm.rank == 0:
        raise KeyError("missing sample")  # leaves its block on an exception: no collective, no hang
    return "done"


def test_leaving_on_an_exception_runs_no_collective() -> None:
    import time

    start = time.monotonic()
    with pytest.raises(Exception) as caught:
        run_ranks(fails_on_rank_zero, 2, timeout=30)
    assert caught.value.failures[0].rank == 0 and caught.value.failures[0].error_type == "KeyError"  # type: ignore[attr-defined]
    assert all(f.error_type != "Stopped" for f in caught.value.failures)  # type: ignore[attr-defined]
    assert time.monotonic() - start < 15


@Communicator.register("logging")
class LoggingComm(NonDistComm):
    """A user's subclass: logs every object collective, otherwise a single process."""

    def __init__(self, config: CommConfig | None = None) -> None:
        super().__init__(config, reason="registered as 'logging'")
        self.calls: list[str] = []
        self.prefix = str(self.config.options.get("prefix", ""))

    @classmethod
    def from_config(cls, config: CommConfig) -> Communicator:
        return cls(config)

    def all_gather_object(self, obj: Any) -> list[Any]:
        self.calls.append(f"{self.prefix}all_gather_object")
        return super().all_gather_object(obj)


def test_registered_subclass_is_built_by_create() -> None:
    with Communicator.create({"type": "logging", "options": {"prefix": "> "}}) as comm:
        assert isinstance(comm, LoggingComm)
        assert comm.all_gather_object(3) == [3]
        assert comm.calls == ["> all_gather_object"]
    assert "logging" in Communicator.registered()
    with pytest.raises(ConfigError, match="not registered"):
        Communicator.create({"type": "missing"})
    with pytest.raises(TypeError, match="Communicator subclasses"):
        Communicator.register("bad")(dict)  # type: ignore[type-var]


def test_describe_names_class_and_reason() -> None:
    comm = NonDistComm(reason="because")
    assert comm.describe().startswith("NonDistComm: rank 0 of 1") and "because" in comm.describe()
    assert repr(comm) == "<NonDistComm rank=0 world_size=1 backend=none>"
    comm.close()
    comm.close()  # twice is fine
    from communicator import CommError

    with pytest.raises(CommError, match="closed"):
        comm.all_gather_object(1)


@Communicator.register("counting-torch")
class CountingTorchComm(TorchComm):
    """A user's subclass of TorchComm that only overrides all_reduce (its override has no guard of its own)."""

    def __init__(self, config: CommConfig | None = None) -> None:
        super().__init__(config)
        self.reduced = 0

    def all_reduce(self, tensor: Any, op: Any = "sum", async_op: bool = False) -> Any:  # type: ignore[override]
        self.reduced += 1
        return super().all_reduce(tensor, op, async_op)


def counting(comm: Communicator) -> dict[str, Any]:
    assert isinstance(comm, CountingTorchComm)
    total = comm.all_reduce(torch.ones(2))
    dict_total = comm.all_reduce_dict({f"k{i}": torch.ones(3000) for i in range(4)})  # too large for one record
    sub = comm.split(color=0)
    return {
        "total": total.tolist(),
        "dict": float(dict_total["k0"][0]),
        "reduced": comm.reduced,
        "owned": "initialised gloo" in comm.describe(),
        "sub": type(sub).__name__,
        "seq": comm._calls.seq,  # collectives counted once each, though the override calls the base's
    }


def test_a_registered_torch_subclass_is_started_by_create_under_launcher_variables() -> None:
    # launch() gives each rank torchrun's variables; create({"type": ...}) builds the subclass on them
    results = run_ranks(counting, 2, cfg={"type": "counting-torch", "backend": "gloo"})
    for result in results:
        assert result["total"] == [2.0, 2.0] and result["dict"] == 2.0 and result["owned"]
        assert result["reduced"] >= 2 and result["sub"] == "SubgroupComm"
    assert results[0]["seq"] == results[1]["seq"]


def test_a_registered_torch_subclass_without_a_launcher_is_a_world_of_one(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    with Communicator.create({"type": "counting-torch", "backend": "gloo"}) as comm:
        assert isinstance(comm, CountingTorchComm) and comm.world_size == 1 and dist.is_initialized()
        assert comm.all_reduce(torch.ones(1)).item() == 1.0 and comm.reduced == 1
    assert not dist.is_initialized()


class Unguarded(NonDistComm):
    """Overrides a public operation without calling super(): the guard applies anyway."""

    def barrier(self, timeout: Any = None) -> None:
        return None


def test_an_override_keeps_the_guard() -> None:
    comm = Unguarded()
    comm.barrier()
    assert comm._calls.seq == 1  # numbered by the guard, though the override never called the base
    comm.close()
    from communicator import CommError

    with pytest.raises(CommError, match="closed"):
        comm.barrier()


def test_info_and_create_make_one_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    from communicator.cli.info import explain

    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(name, raising=False)
    lines = explain(CommConfig())
    with Communicator.create() as comm:
        reason = comm.describe().split("why: ", 1)[1]
    assert lines[0] == f"decision: NonDistComm: {reason}"
    assert lines[1] == "backend: none (configured 'auto')"  # not a backend the single process does not use
