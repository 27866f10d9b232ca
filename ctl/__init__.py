"""ctl: custom training loops for TensorFlow 2, configured with gin.

The public API: subclass `Task`, configure an `Experiment` with gin, and call
`run_experiment` (or `python -m ctl.run`).
"""

import os

# TensorFlow's C++ INFO lines (oneDNN notices, end-of-sequence rendezvous) drown the
# loop's own log; keep warnings and errors. A value the user set wins.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from ctl.adapters.keras_model import KerasModelTask  # noqa: E402
from ctl.adapters.model_garden import ModelGardenTask
from ctl.comforts.best import BestCheckpoint
from ctl.comforts.exporting import BestExporter, CheckpointExporter, FinalExporter, LatestExporter
from ctl.comforts.hooks import EarlyStopping
from ctl.comforts.keras_callbacks import KerasCallbacks
from ctl.comforts.profile import Profile
from ctl.comforts.warm_start import WarmStart
from ctl.core.aggregation import Reducer
from ctl.core.errors import UserError
from ctl.core.hooks import Hook, Run, StopRequest
from ctl.core.schedules import WarmUp, register_schedules
from ctl.core.task import Task
from ctl.core.trainer import Trainer
from ctl.experiment import Experiment, Schedule
from ctl.faults.handler import FaultTolerance
from ctl.sidecar.scheduler import ContinuousEval
from ctl.train_lib import MODES, run_experiment

__all__ = [
    "BestCheckpoint", "BestExporter", "CheckpointExporter", "ContinuousEval",
    "EarlyStopping", "Experiment", "FaultTolerance", "FinalExporter", "Hook",
    "KerasCallbacks", "KerasModelTask", "LatestExporter", "MODES", "ModelGardenTask", "Profile",
    "Reducer", "Run", "Schedule", "StopRequest", "Task", "Trainer", "UserError", "WarmStart", "WarmUp",
    "register_schedules", "run_experiment",
]
