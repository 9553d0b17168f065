"""``communicator check`` as its console script runs it (``main(argv)``), with the pause before exit
of ``multinode_job.let_gloo_threads_finish`` (see there: an abort at exit the core does not avoid yet).

    torchrun ... tests/multinode/check_command.py --timeout 60
    srun -N2 -n4 python tests/multinode/check_command.py
"""

from __future__ import annotations

import sys

from multinode_job import let_gloo_threads_finish  # this script's directory is on sys.path

from communicator.cli import main

if __name__ == "__main__":
    status = main(["check", *sys.argv[1:]])
    let_gloo_threads_finish()
    sys.exit(status)
