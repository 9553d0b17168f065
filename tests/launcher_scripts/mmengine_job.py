"""mmengine's own ``Runner`` on ``communicator.dist``, under a real launcher:

    torchrun --nproc-per-node 2 tests/launcher_scripts/mmengine_job.py WORK_DIR

Each rank trains and validates (``tests/compat/test_mmengine_runner.py``'s ``train``: ``SyncBuffersHook``
and an ``Evaluator`` metric) and prints ``RESULT <rank> <json>``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compat"))  # the test it runs

from test_mmengine_runner import train

if __name__ == "__main__":
    rank = int(os.environ["RANK"])
    print(f"RESULT {rank} {json.dumps(train(sys.argv[1], rank))}", flush=True)
