"""A job across hosts: every rank checks the communicator against the host it really runs on.

    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint mnode01:29400 \\
        multinode_job.py --launcher pytorch --hosts mnode01,mnode02      # on each host
    mpirun -H mnode01:2,mnode02:2 -x MASTER_ADDR=mnode01 -x MASTER_PORT=29500 \\
        python multinode_job.py --launcher openmpi --hosts mnode01,mnode02
    srun -N2 -n4 python multinode_job.py --launcher slurm --hosts mnode01,mnode02

Inside ``with Communicator.create() as comm:`` each rank gathers every rank's ``socket.gethostname()``
and checks, with values computed from rank numbers and host names alone:

- the layout: ``num_nodes`` is the number of hosts, ``node_rank`` the index of this host (in the
  order of each host's first rank), ``local_size`` the ranks on this host and ``local_rank`` this
  rank's place among them; ``describe()`` says so;
- ``comm.local_comm`` and ``comm.split(color=comm.node_rank)``: exactly the ranks on this host;
- every tensor collective across the hosts (all_reduce, broadcast, reduce, all_gather with even
  and uneven shapes, gather, scatter, reduce_scatter, all_to_all, send/recv around the ring),
  every object collective (all_gather_object, gather_object, broadcast_object, scatter_object,
  send_object/recv_object), and ``collect_results`` in dataset order;
- ``GLOO_SOCKET_IFNAME``: set inside the block (to what the library chose, or what the user
  set), as before the block after it.

With ``--check`` the ranks then run what ``communicator check`` runs (``check_job``: every
collective, verified) across the hosts in the same block, and rank 0 prints its table.

Each rank prints ``OK rank=R host=H node=N/NN local=L/LS ifname=I launcher=NAME`` and exits 0,
or ``FAIL rank=R host=H: what differs`` and exits 1. Rank 0 also prints ``DESCRIBE`` and
``describe()``. A rank that hangs dumps its stack and exits after ``--hang-after`` seconds.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's package

import numpy as np
import torch

from communicator import Communicator
from communicator.check import Aborted, check_job

N = 1000  # elements per tensor: large enough to cross hosts in several packets


def same(got: Any, want: Any) -> bool:
    if isinstance(want, torch.Tensor):
        return isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want)
    if isinstance(want, np.ndarray):
        return isinstance(got, np.ndarray) and np.array_equal(got, want)
    if isinstance(want, (list, tuple)):
        return type(got) is type(want) and len(got) == len(want) and all(map(same, got, want))
    if isinstance(want, dict):
        return isinstance(got, dict) and got.keys() == want.keys() and all(same(got[k], want[k]) for k in want)
    return bool(got == want)


class Checker:
    def __init__(self) -> None:
        self.problems: list[str] = []

    def expect(self, what: str, got: Any, want: Any) -> None:
        if not same(got, want):
            self.problems.append(f"{what}: got {str(got)[:200]}, expected {str(want)[:200]}")


def ramp(rank: int, n: int) -> torch.Tensor:
    """Whole numbers, different on every rank: sums of them are exact in float32."""
    return torch.arange(n, dtype=torch.float32) + 1000 * rank


def layout(comm: Communicator, check: Checker, hosts: list[str], launcher: str, expected_hosts: list[str]) -> None:
    host = hosts[comm.rank]
    nodes = list(dict.fromkeys(hosts))  # each host in the order of its first rank
    mine = [rank for rank, other in enumerate(hosts) if other == host]
    check.expect("the job's hosts", sorted(nodes), sorted(expected_hosts))
    check.expect("num_nodes", comm.num_nodes, len(nodes))
    check.expect("node_rank", comm.node_rank, nodes.index(host))
    check.expect("local_size", comm.local_size, len(mine))
    check.expect("local_rank", comm.local_rank, mine.index(comm.rank))
    said = (
        f"{launcher}: rank {comm.rank} of {comm.world_size}, local rank {comm.local_rank} of {comm.local_size}, "
        f"node {comm.node_rank} of {comm.num_nodes}"
    )
    check.expect("describe() names the layout", said in comm.describe(), True)


def subgroups(comm: Communicator, check: Checker, hosts: list[str]) -> None:
    host = hosts[comm.rank]
    mine = [rank for rank, other in enumerate(hosts) if other == host]
    for name, sub in (("local_comm", comm.local_comm), ("split(color=node_rank)", comm.split(color=comm.node_rank))):
        check.expect(f"{name} members", list(sub.global_ranks), mine)
        check.expect(f"{name} rank", sub.rank, mine.index(comm.rank))
        check.expect(f"{name} hosts", sub.all_gather_object(host), [host] * len(mine))
        total = sub.all_reduce(torch.tensor([comm.rank + 1]))
        check.expect(f"{name} all_reduce", int(total.item()), sum(rank + 1 for rank in mine))


def tensors(comm: Communicator, check: Checker) -> None:
    rank, world = comm.rank, comm.world_size
    last = world - 1  # on another host than rank 0
    everyone = range(world)
    summed = sum(ramp(other, N) for other in everyone)

    tensor = ramp(rank, N)
    comm.all_reduce(tensor)
    check.expect("all_reduce", tensor, summed)
    tensor = ramp(last, N) if rank == last else torch.zeros(N)
    comm.broadcast(tensor, src=last)
    check.expect(f"broadcast(src={last})", tensor, ramp(last, N))
    tensor = ramp(rank, N)
    comm.reduce(tensor, dst=last)
    check.expect(f"reduce(dst={last})", tensor, summed if rank == last else ramp(rank, N))
    check.expect("all_gather", comm.all_gather(ramp(rank, N)), [ramp(other, N) for other in everyone])
    uneven = [ramp(other, 3 + other) for other in everyone]
    check.expect("all_gather (uneven shapes)", comm.all_gather(ramp(rank, 3 + rank)), uneven)
    gathered = comm.gather(ramp(rank, 3 + rank), dst=last)
    check.expect(f"gather(dst={last})", gathered, uneven if rank == last else None)
    check.expect("scatter(src=0)", comm.scatter(uneven if rank == 0 else None, src=0), uneven[rank])
    parts = [ramp(rank, N) + 10 * target for target in everyone]
    check.expect("reduce_scatter", comm.reduce_scatter(parts), summed + 10 * rank * world)
    sent = [ramp(rank * world + target, 2 + target) for target in everyone]
    check.expect("all_to_all", comm.all_to_all(sent), [ramp(other * world + rank, 2 + rank) for other in everyone])

    right, left = (rank + 1) % world, (rank - 1) % world
    received = torch.zeros(N)
    if rank % 2 == 0:  # half the ring sends first, so blocking calls cannot all wait on each other
        comm.send(ramp(rank, N), dst=right)
        comm.recv(received, src=left)
    else:
        comm.recv(received, src=left)
        comm.send(ramp(rank, N), dst=right)
    check.expect(f"recv(src={left})", received, ramp(left, N))


def objects(comm: Communicator, check: Checker, hosts: list[str]) -> None:
    rank, world = comm.rank, comm.world_size
    last = world - 1

    def payload(of: int) -> dict[str, Any]:
        return {"rank": of, "host": hosts[of], "array": np.arange(5) + of, "tensor": ramp(of, 4), "none": None}

    everyone = [payload(other) for other in range(world)]
    check.expect("all_gather_object", comm.all_gather_object(payload(rank)), everyone)
    gathered = comm.gather_object(payload(rank), dst=last)
    check.expect(f"gather_object(dst={last})", gathered, everyone if rank == last else None)
    check.expect(f"broadcast_object(src={last})", comm.broadcast_object(payload(rank), src=last), payload(last))
    check.expect("scatter_object(src=0)", comm.scatter_object(everyone if rank == 0 else None, src=0), payload(rank))
    right, left = (rank + 1) % world, (rank - 1) % world
    if rank % 2 == 0:
        comm.send_object(payload(rank), dst=right)
        got = comm.recv_object(src=left)
    else:
        got = comm.recv_object(src=left)
        comm.send_object(payload(rank), dst=right)
    check.expect(f"recv_object(src={left})", got, payload(left))

    size = 5 * world - 1  # DistributedSampler pads the last round by repeating item 0
    part = [{"index": index % size, "host": hosts[rank]} for index in range(rank, 5 * world, world)]
    dataset = [{"index": index, "host": hosts[index % world]} for index in range(size)]
    check.expect("collect_results", comm.collect_results(part, size=size), dataset if rank == 0 else None)


def report(line: str) -> None:
    """One write per line: launchers that merge the ranks' output keep each line whole."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launcher", required=True, help="the name detect_launcher() must give")
    parser.add_argument("--hosts", required=True, help="comma-separated names of the hosts the job must span")
    parser.add_argument("--hang-after", type=float, default=100.0, help="dump the stack and exit after this")
    parser.add_argument("--check", action="store_true", help="also run every collective as `communicator check` does")
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.hang_after, exit=True)

    host = socket.gethostname()
    before = os.environ.get("GLOO_SOCKET_IFNAME")
    check = Checker()
    steps: list[Callable[[Communicator, Checker, list[str]], None]] = [
        lambda comm, check, hosts: layout(comm, check, hosts, args.launcher, args.hosts.split(",")),
        subgroups,
        lambda comm, check, hosts: tensors(comm, check),
        objects,
    ]
    with Communicator.create({"timeout": 60}) as comm:
        rank, world = comm.rank, comm.world_size
        node, nodes, local, local_size = comm.node_rank, comm.num_nodes, comm.local_rank, comm.local_size
        inside = os.environ.get("GLOO_SOCKET_IFNAME")
        hosts = comm.all_gather_object(host)
        for step in steps:  # every rank runs every step, whatever an earlier one found
            step(comm, check, hosts)
        if rank == 0:
            report("DESCRIBE " + comm.describe().replace("\n", " | "))
        try:
            if args.check and check_job(comm, repeat=0) != 0:
                check.problems.append("communicator check failed (see rank 0's table)")
        except Aborted as stopped:
            report(f"FAIL rank={rank} host={host}: communicator check stopped: {stopped}")
            return 1
    check.expect("GLOO_SOCKET_IFNAME after the block", os.environ.get("GLOO_SOCKET_IFNAME"), before)
    if world < 2 or len(set(hosts)) < 2:
        check.problems.append(f"the job does not span hosts: {hosts}")
    if check.problems:
        report(f"FAIL rank={rank} host={host}: " + "; ".join(check.problems))
        return 1
    layout_text = f"node={node}/{nodes} local={local}/{local_size}"
    report(f"OK rank={rank} host={host} {layout_text} ifname={inside} launcher={args.launcher}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
