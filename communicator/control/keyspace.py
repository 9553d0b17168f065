"""A key space of its own for each job in a store that outlives jobs (``communicator store``,
``COMMUNICATOR_STORE``, torchrun's agent store across restarts).

Jobs started one after another with the same ``MASTER_PORT`` meet under the same prefix of the
store; without more, the second would read the first one's keys and dial its dead ranks. So the
ranks of a job agree on a random *space* when they start, through the store alone:

- key ``current`` holds the space being joined: ``<nonce> <world size> <time> <job id>``. The
  first rank to find it empty claims it for its job (``compare_set``: one claim wins).
- each rank takes the *seat* of its rank in that space (``compare_set``: one process per seat),
  says it is alive every :data:`BEAT_SECONDS`, and counts itself in. The last to count itself in
  marks the space complete and empties ``current``: the next job claims a space of its own, even
  while this one runs. The others wait (polling at most twice a second) until the space is complete.
- a claim whose holders are gone (their beat older than :data:`STALE_SECONDS`, or, on this host,
  their process exited) is *abandoned*: every rank in it starts over, and the next claim wins.
- two jobs starting at once with the same ``MASTER_PORT`` on one store *collide*: a claim for a
  world of another size or job (``SLURM_JOB_ID``/``SLURM_STEP_ID``, ``TORCHELASTIC_RUN_ID`` and
  its restart count, ``PMIX_NAMESPACE``, ...), or a seat that a live process holds, is a
  ``CommError`` naming the other job, on every rank that meets it. Ranks with no job id and the
  same size that reach the claim without ever meeting at a seat cannot be told apart.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping

from communicator.control.board import backoff
from communicator.control.log import StoreHandle
from communicator.control.processes import alive
from communicator.errors import CommError

__all__ = ["BEAT_SECONDS", "STALE_SECONDS", "join", "job_identity"]

#: How often a rank waiting for its job's other ranks says it is alive.
BEAT_SECONDS = 2.0
#: How long a rank in a space may go unheard before the space counts as abandoned.
STALE_SECONDS = 10.0
#: Variables the launchers set to the same value on every rank of one job, and differently for another.
JOB_VARIABLES = (
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "PMIX_NAMESPACE",
    "OMPI_MCA_ess_base_jobid",
    "PMI_KVSNAME",
)
_COMPLETE, _ABANDONED, _COLLIDED = "complete", "abandoned", "collided:"


def job_identity(environ: Mapping[str, str] | None = None) -> str:
    """What tells this job from another in the launcher's variables ("" when none says it)."""
    env = os.environ if environ is None else environ
    return ",".join(f"{name}={env[name]}" for name in JOB_VARIABLES if env.get(name))


class _Restart(Exception):
    """The space is abandoned: claim again."""


class _Joining:
    """One rank's attempt to join its job's space (see the module docstring)."""

    def __init__(self, store: StoreHandle, rank: int, size: int, job: str, clock: Callable[[], float]) -> None:
        self.store, self.rank, self.size, self.job, self.clock = store, rank, size, job, clock
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.me = f"{self.host} {self.pid} {uuid.uuid4().hex[:12]}"

    def attempt(self, deadline: float) -> str:
        """The space joined (its prefix), or ``_Restart`` to start over."""
        claim = self.store.compare_set("current", "", f"{uuid.uuid4().hex} {self.size} {self.clock():.0f} {self.job}")
        text = claim.decode(errors="replace")
        nonce, size, made, job = ([*text.split(" ", 3), "", "", "", ""])[:4]
        if len(nonce) != 32 or not size.isdigit() or not made.isdigit():
            self._abandon("", text)  # not a claim this library wrote
        space = f"{nonce}/"
        if int(size) != self.size or job != self.job:
            self._stale_or(space, text, float(made), f"a job of {size} ranks ({job or 'no job id'}) is starting")
        seat = self.store.compare_set(f"{space}seat/{self.rank}", "", self.me).decode(errors="replace")
        if seat != self.me:
            holder = " ".join(seat.split()[:2])
            self._stale_or(space, text, float(made), f"rank {self.rank}'s seat is held by {holder}", collide=True)
        self._beat(space)
        self.store.append(f"{space}who", f"{self.rank},")
        if self.store.add(f"{space}joined", 1) >= self.size:
            if self._stale(space, float(made), seated=True):
                self._abandon(space, text)
            state = self.store.compare_set(f"{space}state", "", _COMPLETE).decode(errors="replace")
            self.store.compare_set("current", text, "")  # the next job claims a space of its own
            return self._outcome(space, state)
        pause, beat = backoff(0.002, 0.5), time.monotonic()
        while True:
            state = self.store.compare_set(f"{space}state", "", "").decode(errors="replace")
            if state:
                return self._outcome(space, state)
            now = time.monotonic()
            if now > deadline:
                raise CommError(
                    f"rank {self.rank} of {self.size}: the other ranks of this job did not reach the store's key space "
                    f"{nonce} in time ({int(self.store.add(f'{space}joined', 0))} of {self.size} did)"
                )
            if now - beat >= BEAT_SECONDS:
                beat = now
                self._beat(space)
            time.sleep(pause())

    def _beat(self, space: str) -> None:
        self.store.set(f"{space}beat/{self.rank}", f"{self.clock():.3f} {self.host} {self.pid}")

    def _outcome(self, space: str, state: str) -> str:
        if state == _COMPLETE:
            return space
        if state.startswith(_COLLIDED):
            raise CommError(f"rank {self.rank} of {self.size}: {state.removeprefix(_COLLIDED).strip()}")
        raise _Restart

    def _stale(self, space: str, made: float, seated: bool = False) -> bool:
        """Whether a rank of ``space`` (another than this one, when it is ``seated`` there) is gone:
        unheard for :data:`STALE_SECONDS`, or its process on this host has exited (a space nobody
        took a seat in: made that long ago)."""
        who = f"{space}who"
        text = self.store.get(who).decode(errors="replace") if self.store.check([who]) else ""
        ranks = {int(r) for r in text.split(",") if r.isdigit() and len(r) < 8}
        ranks -= {self.rank} if seated else set()
        if not ranks:
            return self.clock() - made > STALE_SECONDS
        keys = [f"{space}beat/{r}" for r in sorted(ranks)]
        if not self.store.check(keys):  # listed without a beat: not one of ours (a get would block)
            return True
        for beat in self.store.multi_get(keys):
            at, host, pid = ([*beat.decode(errors="replace").split(), "", "", ""])[:3]
            try:
                if self.clock() - float(at) > STALE_SECONDS:
                    return True
            except ValueError:
                return True
            if host == self.host and pid.isdigit() and not alive(int(pid)):
                return True
        return False

    def _stale_or(self, space: str, claim: str, made: float, why: str, collide: bool = False) -> None:
        """Start over when ``space`` is abandoned; else the job collides with another: raise, and
        (``collide``) have every rank waiting in that space raise too."""
        if self._stale(space, made):
            self._abandon(space, claim)
        text = (
            f"another job uses this store's key space (the same MASTER_PORT) and is starting now: {why}; "
            "give the jobs different MASTER_PORTs, or start this one after that one has started"
        )
        if collide:
            self.store.compare_set(f"{space}state", "", f"{_COLLIDED} {text}")
            self.store.compare_set("current", claim, "")
        raise CommError(f"rank {self.rank} of {self.size}: {text}")

    def _abandon(self, space: str, claim: str) -> None:
        if space:
            self.store.compare_set(f"{space}state", "", _ABANDONED)
        self.store.compare_set("current", claim, "")
        raise _Restart


def join(
    store: StoreHandle,
    rank: int,
    size: int,
    limit: float,
    job: str | None = None,
    clock: Callable[[], float] = time.time,
) -> str:
    """The prefix of this job's key space in ``store`` (see the module docstring), agreed with the
    job's other ranks within ``limit`` seconds; a ``CommError`` when they do not come in time, or
    another job collides with this one."""
    joining = _Joining(store, rank, size, job_identity() if job is None else job, clock)
    deadline = time.monotonic() + limit
    while True:
        try:
            return joining.attempt(deadline)
        except _Restart:
            if time.monotonic() > deadline:
                raise CommError(
                    f"rank {rank} of {size}: no key space of the store could be agreed on in {limit:g} s"
                ) from None
            time.sleep(0.01)
