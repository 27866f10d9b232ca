"""`python -m tests.sidecar_killed_after_metrics_line ARGS`: `python -m ctl.run ARGS`, whose
sidecar SIGKILLs itself in the window between appending an evaluation's metrics line and
recording its progress (its first `save_progress`), for tests/test_continuous_eval.py.

The fault point is patched in here, in the child process: ctl's own code has none.
"""

import os
import runpy
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # As ctl.run sets it, before TensorFlow.

from ctl.sidecar import continuous_eval


def _killed(*unused_args):
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    continuous_eval.save_progress = _killed
    sys.argv[0] = "ctl.run"
    runpy.run_module("ctl.run", run_name="__main__", alter_sys=True)
