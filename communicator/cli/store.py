"""``communicator store``: serve a rendezvous store outside the ranks, so that the loss of any rank
(rank 0 included) leaves it up and the survivors can ``shrink()``.

It listens on loopback unless ``--host`` names another address: a store takes any key from any
process that reaches its port. With ``COMMUNICATOR_STORE_TOKEN`` set (the same secret on every
rank), the ranks sign what they write and ignore what is not signed; the store holds a mark of
the secret, so that a rank started with another secret, or none, stops at its start.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import socket
import threading

from torch._C._distributed_c10d import TCPStore

from communicator.control.records import MARK_KEY, TOKEN_VARIABLE, mark

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default: 127.0.0.1, this host only; 0.0.0.0: every interface)",
    )
    parser.add_argument("--port", type=int, default=29400, help="the port to listen on (default: 29400; 0: any free)")


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def run(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: stop.set())
    token = os.environ.get(TOKEN_VARIABLE, "")
    try:
        # torch's server listens on every interface whatever host it is given: it gets a socket
        # bound to the address asked for
        family, kind, _, _, address = socket.getaddrinfo(
            args.host, args.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        listener = socket.socket(family, kind)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(socket.SOMAXCONN)
        port = listener.getsockname()[1]
        server = TCPStore(
            args.host, port, is_master=True, wait_for_workers=False, use_libuv=True, master_listen_fd=listener.fileno()
        )
        if token:
            server.set(MARK_KEY, mark(token))
    except Exception as error:  # noqa: BLE001 - torch raises several kinds for a port in use
        print(f"communicator store: cannot listen on {args.host}:{args.port}: {error}", flush=True)
        return 1
    secret = f" and {TOKEN_VARIABLE} (the secret it was started with)" if token else ""
    print(
        f"serving a rendezvous store on {args.host}:{server.port}; give the ranks "
        f"COMMUNICATOR_STORE=<this host>:{server.port}{secret} (Ctrl-C stops it)",
        flush=True,
    )
    if not _loopback(args.host) and not token:
        print(
            f"communicator store: warning: listening beyond this host without {TOKEN_VARIABLE}: any process that "
            "reaches the port can write records the ranks believe (set the same secret here and on every rank)",
            flush=True,
        )
    stop.wait()
    listener.close()
    return 0
