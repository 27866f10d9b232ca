"""ctl: custom training loops for TensorFlow 2, configured with gin.

The public API: subclass `Task`, configure an `Experiment` with gin, and call
`run_experiment` (or `python -m ctl.run`).
"""

import os

# TensorFlow's C++ INFO lines (oneDNN notices, end-of-sequence rendezvous) drown the
# loop's own log; keep warnings and errors. A value the user set wins.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from ctl.best import BestCheckpoint  # noqa: E402
from ctl.errors import UserError
from ctl.experiment import Experiment, Schedule
from ctl.exporting import BestExporter, CheckpointExporter, FinalExporter, LatestExporter
from ctl.hooks import EarlyStopping, Hook, Run, StopRequest
from ctl.keras_callbacks import KerasCallbacks
from ctl.faults import FaultTolerance
from ctl.reducers import Reducer
from ctl.sidecar import ContinuousEval
from ctl.task import Task
from ctl.train_lib import MODES, run_experiment
from ctl.trainer import Trainer
from ctl.warm_start import WarmStart

__all__ = [
    "BestCheckpoint", "BestExporter", "CheckpointExporter", "ContinuousEval",
    "EarlyStopping", "Experiment", "FaultTolerance", "FinalExporter", "Hook",
    "KerasCallbacks", "LatestExporter", "MODES", "Reducer", "Run", "Schedule",
    "StopRequest", "Task", "Trainer", "UserError", "WarmStart", "run_experiment",
]
