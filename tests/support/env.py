"""Where the checkout is, the test gin files, and the environment of the processes tests start."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEST_GIN = os.path.join(ROOT, "tests", "regression.gin")  # A 20-step RegressionTask run.
FAULTS_GIN = os.path.join(ROOT, "tests", "faults.gin")  # ProbeTask, seed 7.


def ctl_env(env=None):
    """This process's environment, with this checkout on PYTHONPATH and `env` on top."""
    return {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
