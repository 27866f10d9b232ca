"""ctl: custom training loops for TensorFlow 2, configured with gin.

The public API: subclass `Task`, configure an `Experiment` with gin, and call
`run_experiment` (or `python -m ctl.run`).
"""

import os

# TensorFlow's C++ INFO lines (oneDNN notices, end-of-sequence rendezvous) drown the
# loop's own log; keep warnings and errors. A value the user set wins.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from ctl.errors import UserError  # noqa: E402
from ctl.experiment import Experiment, Schedule
from ctl.faults import FaultTolerance
from ctl.reducers import Reducer
from ctl.sidecar import ContinuousEval
from ctl.task import Task
from ctl.train_lib import MODES, run_experiment
from ctl.trainer import Trainer

__all__ = [
    "ContinuousEval", "Experiment", "FaultTolerance", "MODES", "Reducer", "Schedule", "Task",
    "Trainer", "UserError", "run_experiment",
]
