"""Tampering with the control plane's store and the host's relay file, on every communicator kind the
conformance suite knows: records that are not records, an event counter pushed to a trillion, a
relay with damaged lines or without its first line, and a relay whose lock a process holds while a
peer fails. Each kind with a control plane goes on (its operations give the right answer; a failure
still reaches every rank); the kinds without one (one process, ranks as threads) have nothing to
tamper with, which is checked too. The planted-symlink folder is the relay's own check, the same
for every kind (``tests/control/test_relay.py``)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch
from test_conformance import RUNNERS

from communicator import Communicator, RemoteError
from communicator.control.plane import Control
from communicator.control.relay import Relay

WORLD = 3


def _garbage_records(plane: Control) -> None:
    store = plane.world.store
    for value in ("not json at all", '{"kind": "fail",\n"board": ""}', "[1, 2]", '{"kind": "fail", "board": ""}'):
        store.set(f"event/{store.add('events', 1)}", value)


def _huge_counter(plane: Control) -> None:
    plane.world.store.add("events", 10**12)


def _turn(relay: Relay) -> Any:
    """This process's turn on the relay (its lock held), made or waited for."""
    deadline = time.monotonic() + 10
    while (turn := relay.turn()) is None or turn._fd < 0:
        assert time.monotonic() < deadline, "no turn on the relay within 10 s"
        time.sleep(0.05)
    return turn


def _damaged_relay(plane: Control) -> None:
    relay = plane.world.relay
    assert relay is not None
    with _turn(relay), open(relay.path, "ab") as file:
        file.write(b"garbage\n1 {not json\n7 \n12345678901234567890123 {}\n\xff\xfe 1\n")


def _relay_without_its_first_line(plane: Control) -> None:
    relay = plane.world.relay
    assert relay is not None
    with _turn(relay):  # made by now (and its folder), whatever another job's closing removed
        relay.path.write_bytes(b"x" * 60 + b"\n2 {}\n")


TAMPERS = {
    "garbage records": _garbage_records,
    "huge counter": _huge_counter,
    "damaged relay": _damaged_relay,
    "relay without its first line": _relay_without_its_first_line,
}


def tampered(comm: Communicator, tamper: str) -> Any:
    plane = comm._plane()
    if plane is None:
        return "no control plane"
    comm.barrier()
    if comm.rank == 0:
        TAMPERS[tamper](plane)
    comm.barrier()
    if comm.rank == 1:
        time.sleep(0.6)  # the others wait in the all_reduce meanwhile, reading what was tampered with
    total = comm.all_reduce(torch.ones(1)).item()
    comm.barrier()
    return total


def held_relay_while_a_peer_fails(comm: Communicator) -> Any:
    plane = comm._plane()
    if plane is None:
        return "no control plane"
    relay = plane.world.relay
    assert relay is not None
    comm.barrier()
    released, caught = threading.Event(), ("no error", ())
    if comm.rank == 2:  # holds the host's turn, as a stopped process or a debugger would

        def hold() -> None:
            with _turn(relay):
                released.wait(20)

        holder = threading.Thread(target=hold, daemon=True)
        holder.start()
    try:
        with comm.fail_together("step"):
            if comm.rank == 1:
                time.sleep(0.5)
                raise ValueError("a corrupt batch")
            comm.all_reduce(torch.ones(1))
    except RemoteError as error:
        caught = (type(error).__name__, error.ranks)
    finally:
        released.set()
    return caught


def _expected(name: str, value: Any) -> list[Any]:
    if name in ("nondist", "thread"):
        return ["no control plane"] * (1 if name == "nondist" else WORLD)
    return [value] * WORLD


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(RUNNERS))
def test_every_kind_goes_on_past_a_tampered_store_and_relay(name: str) -> None:
    run, _ = RUNNERS[name]
    world = 1 if name == "nondist" else WORLD
    for tamper in TAMPERS:
        assert run(tampered, world, tamper) == _expected(name, float(world)), tamper


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", list(RUNNERS))
def test_every_kind_hears_of_a_failure_while_its_relay_is_held(name: str) -> None:
    run, _ = RUNNERS[name]
    world = 1 if name == "nondist" else WORLD
    results = run(held_relay_while_a_peer_fails, world)
    if name in ("nondist", "thread"):
        assert results == _expected(name, None)
        return
    assert results == [("RemoteError", (1,))] * WORLD  # the raising rank's block raises it too
