"""ctl: custom training loops for TensorFlow 2, configured with gin.

The public API: subclass `Task`, configure an `Experiment` with gin, and call
`run_experiment` (or `python -m ctl.run`). The hooks a run may list
(`ctl.Experiment.hooks`) and the hook protocol are `ctl.hooks.*`.

`import ctl` itself is cheap: the first use of any public name imports the
whole API (TensorFlow and every gin configurable with it), so that a tool
that needs no TensorFlow (`ctl.launch`, `ctl.report`) starts in a fraction of
a second, while code that touches `ctl.<anything>` sees the package as if it
had been imported eagerly.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # What editors and type checkers follow (`X as X`: re-exported); `__getattr__` imports at run time.
    from ctl import hooks as hooks
    from ctl.adapters.keras_model import KerasModelTask as KerasModelTask
    from ctl.adapters.model_garden import ModelGardenTask as ModelGardenTask
    from ctl.core.aggregation import Aggregation as Aggregation, Reducer as Reducer
    from ctl.config.arguments import Check as Check, Range as Range, check_arguments as check_arguments
    from ctl.core.checkpointing import restore_model as restore_model
    from ctl.utils.errors import UserError as UserError
    from ctl.core.runner import TrainLoopEnd as TrainLoopEnd
    from ctl.core.schedules import register_schedules as register_schedules, with_warmup as with_warmup
    from ctl.core.task import Task as Task
    from ctl.core.trainer import Trainer as Trainer
    from ctl.experiment import Experiment as Experiment, Schedule as Schedule
    from ctl.faults.handler import FaultTolerance as FaultTolerance
    from ctl.sidecar.scheduler import ContinuousEval as ContinuousEval
    from ctl.cluster.run_plan import MODES as MODES
    from ctl.train_lib import run_experiment as run_experiment

_MODULES = {  # module -> the public names it defines
    "ctl.adapters.keras_model": ["KerasModelTask"],
    "ctl.adapters.model_garden": ["ModelGardenTask"],
    "ctl.core.aggregation": ["Aggregation", "Reducer"],
    "ctl.config.arguments": ["Check", "Range", "check_arguments"],
    "ctl.core.checkpointing": ["restore_model"],
    "ctl.utils.errors": ["UserError"],
    "ctl.cluster.run_plan": ["MODES"],
    "ctl.core.schedules": ["register_schedules", "with_warmup"],
    "ctl.core.task": ["Task"],
    "ctl.core.runner": ["TrainLoopEnd"],
    "ctl.core.trainer": ["Trainer"],
    "ctl.experiment": ["Experiment", "Schedule"],
    "ctl.faults.handler": ["FaultTolerance"],
    "ctl.sidecar.scheduler": ["ContinuousEval"],
    "ctl.train_lib": ["run_experiment"],
}
# The hooks a run lists, and what a hook is, under `ctl.hooks.*` (ctl/hooks/__init__.py).
_SUBMODULES = ["hooks"]

__all__ = sorted([name for names in _MODULES.values() for name in names] + _SUBMODULES)


def import_api() -> None:
    """Imports every public name, and so registers every gin configurable of ctl.

    Called by the first use of a public name, and by `ctl.run` before it
    parses a gin file (which may bind `ctl.` names no user module touched).
    """
    for module, names in _MODULES.items():
        loaded = importlib.import_module(module)
        for name in names:
            globals()[name] = getattr(loaded, name)
    for name in _SUBMODULES:
        globals()[name] = importlib.import_module(f"ctl.{name}")


def __getattr__(name):
    if name not in __all__:
        raise AttributeError(f"module 'ctl' has no attribute {name!r}")
    import_api()
    return globals()[name]


def __dir__():
    return sorted(set(globals()) | set(__all__))
