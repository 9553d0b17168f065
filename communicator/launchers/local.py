"""Jobs whose ranks all run on this machine."""

from __future__ import annotations

import random
import socket

__all__ = ["free_port", "reserve_port"]

_EPHEMERAL = "/proc/sys/net/ipv4/ip_local_port_range"
_LOWEST = 10000  # below this, ports tend to belong to services
_TRIES = 64


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now.

    It is drawn below the range the system hands out to outgoing connections (where one exists
    and leaves room), so that between this call and the moment a store binds the port, none of
    the connections other processes open (a gloo group opens many) can take it; drawn at random,
    so that processes picking ports at the same time rarely meet. Elsewhere: a port the system
    picks.
    """
    first_ephemeral = _first_ephemeral_port()
    if first_ephemeral is not None and first_ephemeral > _LOWEST + _TRIES:
        for port in random.sample(range(_LOWEST, first_ephemeral), _TRIES):
            if _bindable(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def reserve_port() -> socket.socket:
    """A free port, held until the returned socket is closed.

    The socket is bound with ``SO_REUSEADDR`` and never listens: a store started on the port later
    (torch's set ``SO_REUSEADDR`` too) binds it all the same, while :func:`free_port` in any other
    process finds it taken. Two jobs started at once on one machine cannot then both choose it in
    the time between the choice and their store's start.
    """
    while True:
        holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            holder.bind(("", free_port()))
        except OSError:  # taken between the check and this bind: choose again
            holder.close()
            continue
        return holder


def _first_ephemeral_port() -> int | None:
    try:
        with open(_EPHEMERAL) as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))  # every address: a store listens on all of them
        except OSError:
            return False
        return True
