"""``communicator store``: serve a rendezvous store outside the ranks, so that the loss of any rank
(rank 0 included) leaves it up and the survivors can ``shrink()``."""

from __future__ import annotations

import argparse
import signal
import threading

from torch._C._distributed_c10d import TCPStore

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="0.0.0.0", help="the address to listen on (default: every interface)")
    parser.add_argument("--port", type=int, default=29400, help="the port to listen on (default: 29400; 0: any free)")


def run(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: stop.set())
    try:
        server = TCPStore(args.host, args.port, is_master=True, wait_for_workers=False, use_libuv=True)
    except Exception as error:  # noqa: BLE001 - torch raises several kinds for a port in use
        print(f"communicator store: cannot listen on {args.host}:{args.port}: {error}", flush=True)
        return 1
    print(
        f"serving a rendezvous store on {args.host}:{server.port}; give the ranks "
        f"COMMUNICATOR_STORE=<this host>:{server.port} (Ctrl-C stops it)",
        flush=True,
    )
    stop.wait()
    return 0
