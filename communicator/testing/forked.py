"""Imported last by :func:`~communicator.testing.launch`'s fork server, after the modules every rank
needs: what they made is moved out of the garbage collector's reach (``gc.freeze``).

A rank forked from the server would otherwise traverse every object of torch, NumPy and this
package in its first full collection, writing to each one's page: about 0.1 s of CPU and a copy of
those pages per rank, on every launch.
"""

from __future__ import annotations

import gc

gc.freeze()
