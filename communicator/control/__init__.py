"""The control plane: what makes a failure, a closing or a stall reach every rank, for every
communicator and any size of job.

Over a key-value store the transport supplies (torch's ``TCPStore`` qualifies), and works whose
wait takes a timeout, it gives every communicator:

- an :mod:`event log <communicator.control.log>`: failures, refused arguments, mismatches, lost
  peers, stall verdicts and closings, posted once and read by each waiting rank with one request;
- :mod:`boards <communicator.control.board>`: one namespace per communicator (subgroups heed the
  failures of the boards above), with a barrier through the store that names late ranks;
- :mod:`bounded waits <communicator.control.waiting>` that look at the board about once a second;
- :mod:`liveness <communicator.control.liveness>`: process ids on this host, probe sockets on others;
- :mod:`stall diagnosis <communicator.control.stalls>`: one judge per operation reads every status
  in one request and posts its verdict.

Its cost is flat per rank and linear in the job: O(1) requests per rank to start; while no
operation waits, only a status write when a process settles somewhere new or its heartbeat is
due (every 5 s, less often past 2,500 ranks); about one request a second while one waits; O(N) in
all for a failure or a stall beat, and O(N) requests and bytes in all when every rank posts (past
the first 16 of a kind, posts are counted, not recorded: see :mod:`communicator.control.board`).
``python -m benchmarks.control_plane`` counts requests, keys and bytes for virtual ranks.
"""

from communicator.control.plane import Control, World

__all__ = ["Control", "World"]
