"""``communicator trace DIR`` on hostile and broken dumps: it names each file it leaves out and why,
goes on with the others, exits 1, and never hangs, prints a traceback or passes on a control character."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

from communicator.cli import main

pytestmark = pytest.mark.timeout(120)


def event(op: str = "all_reduce", seq: int = 1, **more: Any) -> dict[str, Any]:
    fields = {"op": op, "seq": seq, "p2p": False, "state": "done", "error": None, "site": "train.py:3"}
    return {**fields, "dtypes": ["float32"], "shapes": [[4]], **more}


def dump(rank: int, world: int = 2, seq: int = 1, events: list[Any] | None = None, **more: Any) -> dict[str, Any]:
    return {"group": "world", "rank": rank, "world_size": world, "seq": seq, "running": None,
            "events": [event()] if events is None else events, **more}  # fmt: skip


def write(directory: pathlib.Path, name: str, content: Any) -> None:
    path = directory / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))


GOOD = json.dumps(dump(0))
MALFORMED: dict[str, Any] = {
    "invalid": b"{not json",
    "truncated": GOOD[: len(GOOD) // 2],
    "empty": b"",
    "binary": bytes(range(256)) * 4,
    "nested": "[" * 100_000 + "]" * 100_000,
    "list": [dump(0)],
    "no-rank": {k: v for k, v in dump(0).items() if k != "rank"},
    "text-rank": dump("0"),  # type: ignore[arg-type]
    "bool-rank": dump(True),  # type: ignore[arg-type]
    "rank-beyond-world": dump(2),
    "huge-world": dump(0, world=10**12),
    "no-seq": {k: v for k, v in dump(0).items() if k != "seq"},
    "float-seq": dump(0, seq=1.5),  # type: ignore[arg-type]
    "events-not-a-list": dump(0, events={"op": "x"}),  # type: ignore[arg-type]
    "event-not-a-dict": dump(0, events=["all_reduce"]),
    "event-without-state": dump(0, events=[{k: v for k, v in event().items() if k != "state"}]),
    "state-not-text": dump(0, events=[event(state=3)]),
    "negative-dim": dump(0, events=[event(shapes=[[-1]])]),
    "group-not-text": dump(0, group=["world"]),
}


def run_trace(directory: pathlib.Path | str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["trace", str(directory)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_dump_is_named_with_its_reason_and_the_others_are_read(
    case: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, "world-rank1.json", dump(1))  # a good dump beside the bad one
    write(tmp_path, "bad-rank0.json", MALFORMED[case])
    code, out, err = run_trace(tmp_path, capsys)
    assert code == 1
    [line] = err.splitlines()
    assert line.startswith(f"communicator trace: left out {tmp_path / 'bad-rank0.json'}: "), line
    assert "world: 2 ranks, dumps from ranks [1]" in out and "no dump from ranks [0]" in out


def test_a_fifo_a_directory_and_an_oversized_file_are_not_read(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    os.mkfifo(tmp_path / "world-rank0.json")  # opening it to read would wait for a writer
    (tmp_path / "world-rank1.json").mkdir()
    with open(tmp_path / "world-rank2.json", "wb") as sparse:
        sparse.truncate(1 << 40)
    code, out, err = run_trace(tmp_path, capsys)
    assert code == 1 and "no flight-recorder dumps (*-rank*.json) that could be read" in out
    reasons = err.splitlines()
    assert [line.rsplit(": ", 1)[1] for line in reasons[:2]] == ["not a regular file"] * 2
    assert "more than a dump's" in reasons[2]


def test_control_characters_cannot_forge_report_lines(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    forged = "all_reduce\n  diverged at #1: rank 0 forged\x1b[2J\x07"
    write(tmp_path, "world-rank0.json", dump(0, events=[event(op=forged, site="a.py:1\r\x1b]0;title\x07")]))
    write(tmp_path, "world-rank1.json", dump(1, group="world\nworld: 9 ranks"))
    code, out, err = run_trace(tmp_path, capsys)
    assert code == 0 and not err
    assert not any((ord(c) < 32 and c != "\n") or c == "\x7f" for c in out), repr(out)
    assert all(line.startswith(("world", "  ")) for line in out.splitlines()), out
    assert "all_reduce\\n  diverged at #1: rank 0 forged\\x1b[2J\\x07 float32[4] at a.py:1\\r\\x1b]0;title\\x07" in out


def test_a_huge_world_is_reported_in_spans(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path, "world-rank5.json", dump(5, world=2**31 - 1))
    code, out, _ = run_trace(tmp_path, capsys)
    assert code == 0 and "no dump from ranks [0-4, 6-2147483646]" in out


def test_the_command_in_a_process_never_hangs_nor_prints_a_traceback(tmp_path: pathlib.Path) -> None:
    os.mkfifo(tmp_path / "world-rank0.json")
    for case, content in MALFORMED.items():
        write(tmp_path, f"{case}-rank0.json", content)
    write(tmp_path, "world-rank1.json", dump(1))
    result = subprocess.run(
        [sys.executable, "-m", "communicator", "trace", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == len(MALFORMED) + 1
    assert "world: 2 ranks, dumps from ranks [1]" in result.stdout


def test_a_missing_directory_is_an_error_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_trace("/nonexistent\x1b[2J", capsys)
    assert code == 2 and not out and err == "communicator trace: /nonexistent\\x1b[2J is not a directory\n"


def test_a_folder_without_dumps_is_a_failure(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing to merge (a wrong folder, a job that never dumped) is not a success."""
    code, out, _ = run_trace(tmp_path, capsys)
    assert code == 1 and "no flight-recorder dumps" in out
