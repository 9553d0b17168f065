"""Resident memory around a call: how much a rank's resident set grew at its peak.

On Linux the peak (``VmHWM`` in ``/proc/self/status``) is reset before each call by writing ``5``
to ``/proc/self/clear_refs``, so ``peak - resident before`` is what the call itself needed at
its worst: its buffers, copies and results, whatever allocator they came from. Elsewhere the
process's lifetime peak (``ru_maxrss``) stands in, an upper bound.
"""

from __future__ import annotations

import resource
import sys

__all__ = ["peak_growth_start", "peak_growth_since"]

_STATUS = "/proc/self/status"


def _status_bytes(field: str) -> int | None:
    try:
        with open(_STATUS) as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        return False
    return True


def _lifetime_peak() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def peak_growth_start() -> int:
    """Reset the peak and return the resident bytes now (call before the measured call)."""
    resident = _status_bytes("VmRSS")
    _reset_peak()
    return resident if resident is not None else _lifetime_peak()


def peak_growth_since(start: int) -> int:
    """The peak resident bytes since :func:`peak_growth_start`, less what was resident then."""
    peak = _status_bytes("VmHWM")
    return max(0, (peak if peak is not None else _lifetime_peak()) - start)
