"""CommConfig: built from None, a mapping or itself; every bad value is a ConfigError naming it."""

from __future__ import annotations

from datetime import timedelta

import pytest

from communicator import CommConfig, ConfigError


def test_defaults_and_mmengine_style_mapping() -> None:
    assert CommConfig().timeout == timedelta(minutes=30) and CommConfig().backend == "auto"
    cfg = CommConfig.of({"backend": "NCCL", "timeout": 10800, "launcher": "slurm", "port": 29500})
    assert (cfg.backend, cfg.launcher, cfg.master_port) == ("nccl", "slurm", 29500)
    assert cfg.timeout == timedelta(seconds=10800)
    assert CommConfig.of(cfg) is cfg
    assert CommConfig.of({"timeout": timedelta(seconds=5)}).timeout == timedelta(seconds=5)


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"backend": "tcp"}, "backend='tcp'"),
        ({"launcher": "kubernetes"}, "launcher='kubernetes'"),
        ({"timeout": 0}, "timeout=0"),
        ({"timeout": "10"}, "timeout='10'"),
        ({"timeout": True}, "timeout=True"),
        ({"master_port": 70000}, "master_port=70000"),
        ({"port": "29500"}, "master_port='29500'"),
        ({"serializer": "json"}, "serializer='json'"),
        ({"serializer": 42}, "serializer=42"),
        ({"trusted": "mypkg."}, "trusted='mypkg.'"),
        ({"safe_max_expansion": 0}, "safe_max_expansion=0"),
        ({"safe_max_expansion": True}, "safe_max_expansion=True"),
        ({"safe_max_expansion": "64"}, "safe_max_expansion='64'"),
        ({"object_buffer_bytes": 1024}, "object_buffer_bytes=1024"),
        ({"object_buffer_bytes": True}, "object_buffer_bytes=True"),
        ({"object_buffer_bytes": 2.0**20}, "object_buffer_bytes=1048576.0"),
        ({"debug": "yes"}, "debug='yes'"),
        ({"stats": 1}, "stats=1"),
        ({"stall_seconds": 0}, "stall_seconds=0"),
        ({"stall_seconds": "5"}, "stall_seconds='5'"),
        ({"trace_dir": ""}, "trace_dir=''"),
        ({"trace_events": 0}, "trace_events=0"),
        ({"device": "gpu:x"}, "device='gpu:x'"),
        ({"master_addr": ""}, "master_addr=''"),
        ({"colour": "red"}, "unknown config key 'colour'"),
        ({"port": 1, "master_port": 2}, "given twice"),
    ],
)
def test_bad_values_name_the_field_and_what_is_allowed(values: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        CommConfig.of(values)
    assert named in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_not_a_config() -> None:
    with pytest.raises(ConfigError, match="expected None, a mapping or a CommConfig"):
        CommConfig.of(["gloo"])  # type: ignore[arg-type]


def test_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMMUNICATOR_DEBUG", "1")
    monkeypatch.setenv("COMMUNICATOR_TIMEOUT", "12.5")
    monkeypatch.setenv("COMMUNICATOR_BACKEND", "gloo")
    monkeypatch.setenv("COMMUNICATOR_TRUSTED", "mypkg., other.Box")
    monkeypatch.setenv("COMMUNICATOR_SAFE_MAX_EXPANSION", "64")
    cfg = CommConfig.of(None)
    assert cfg.debug and cfg.timeout == timedelta(seconds=12.5) and cfg.backend == "gloo"
    assert cfg.trusted == ("mypkg.", "other.Box") and cfg.safe_max_expansion == 64
    assert CommConfig().safe_max_expansion == 256
    monkeypatch.setenv("COMMUNICATOR_SAFE_MAX_EXPANSION", "lots")
    with pytest.raises(ConfigError, match="COMMUNICATOR_SAFE_MAX_EXPANSION"):
        CommConfig.of(None)
    monkeypatch.delenv("COMMUNICATOR_SAFE_MAX_EXPANSION")
    monkeypatch.setenv("COMMUNICATOR_OBJECT_BUFFER_BYTES", "1048576")
    assert CommConfig.of(None).object_buffer_bytes == 1048576
    assert CommConfig().object_buffer_bytes == 16 * 1024 * 1024
    monkeypatch.setenv("COMMUNICATOR_OBJECT_BUFFER_BYTES", "8MiB")
    with pytest.raises(ConfigError, match="COMMUNICATOR_OBJECT_BUFFER_BYTES"):
        CommConfig.of(None)
    monkeypatch.delenv("COMMUNICATOR_OBJECT_BUFFER_BYTES")
    monkeypatch.setenv("COMMUNICATOR_STATS", "yes")
    monkeypatch.setenv("COMMUNICATOR_STALL_SECONDS", "2.5")
    monkeypatch.setenv("COMMUNICATOR_TRACE_DIR", "/tmp/traces")
    monkeypatch.setenv("COMMUNICATOR_TRACE_EVENTS", "64")
    cfg = CommConfig.of(None)
    assert cfg.stats and cfg.stall_seconds == 2.5 and cfg.trace_dir == "/tmp/traces" and cfg.trace_events == 64
    assert not CommConfig().stats and CommConfig().stall_seconds == 10.0 and CommConfig().trace_dir is None
    monkeypatch.setenv("COMMUNICATOR_DEBUG", "maybe")
    with pytest.raises(ConfigError, match="COMMUNICATOR_DEBUG"):
        CommConfig.of(None)


def test_user_serializer_object() -> None:
    import json

    class Json:
        def dumps(self, obj: object) -> bytes:
            return json.dumps(obj).encode()

        def loads(self, data: bytes | memoryview) -> object:
            return json.loads(bytes(data))

    codec = Json()
    assert CommConfig(serializer=codec).serializer is codec
    assert CommConfig().replace(debug=True).debug
