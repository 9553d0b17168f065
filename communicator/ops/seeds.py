"""Random seeds that every rank agrees on, drawn without moving any global random state."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import torch

__all__ = ["draw_seed", "rng_digest"]


def draw_seed(index: int) -> int:
    """The ``index``-th seed drawn from a copy of the global NumPy random state.

    The global state stays as it is; a run seeded with ``np.random.seed(s)`` draws the same
    seeds every time, and successive indices give different seeds.
    """
    copy = np.random.RandomState()
    copy.set_state(np.random.get_state())
    base = int(copy.randint(2**31))
    return int(np.random.SeedSequence([base, index]).generate_state(1)[0] % 2**31)


def rng_digest() -> str:
    """A digest of the Python, NumPy and torch global random states."""
    h = hashlib.blake2b(digest_size=16)
    h.update(repr(random.getstate()).encode())
    h.update(repr(np.random.get_state(legacy=True)).encode())
    h.update(torch.get_rng_state().numpy().tobytes())
    return h.hexdigest()
