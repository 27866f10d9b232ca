"""Hyperparameters in TensorBoard: each run's operative gin values as an HParams summary.

When a training run ends normally, the chief writes the operative config
(`ctl.config.gin_config.operative_values`: every parameter gin bound or defaulted,
macros included) with `tensorboard.plugins.hparams.api.hparams` to an events
file in `<model_dir>` itself, the run whose `train/` and `eval/` scalars hold
the metrics. Point TensorBoard at a directory of model dirs and the HParams
dashboard lists every run of a sweep side by side, with its final eval metrics
(`eval/loss`, `eval/accuracy`, ...). The same values are the settings in
`python -m ctl.report --model_dir=A --model_dir=B`'s table.

As the table shows them (`tensorboard_values`): a parameter bound to a macro
shows the macro's value (`Schedule.train_steps: 2000`, not `%TRAIN_STEPS`); an
integer shows as one (TensorBoard keeps numbers as floats and prints `2000.00`:
integers are written as their text); and two columns say how the run ended:
`state` (`complete`; `stopped`, a stop a hook asked for, e.g. early stopping;
for a sweep's trial, `pruned` when its pruner stopped it (`END_STATE`, set by
`ctl.sweep.trial`), and `failed`, written by `ctl.sweep.trial` when its run
failed) and `step`, its last global step.

ctl adds this hook to every run, on the chief.
"""

import os
from typing import Any, Callable, Dict, Optional

import tensorflow as tf

from ctl.config import gin_config as config
from ctl.core.hook_protocol import Hook
from ctl.model_dir import is_object_store
from ctl.model_dir.background import uploads
from ctl.model_dir.files import upload_written

STATE, STEP = "state", "step"  # The columns that say how the run ended.
# Names a run's end state other than complete or stopped (None: not this run), set by the
# program the run is part of: `ctl.sweep.trial` says "pruned" when its pruner stopped it.
END_STATE: Optional[Callable[[Any], Optional[str]]] = None


def tensorboard_values(values: Dict[str, Any]) -> Dict[str, Any]:
    """`values` (`config.operative_values`) as the HParams table should show them: macros
    resolved to their values, integers as their text (TensorBoard has no integer type).

    Args:
        values: the operative values (`config.operative_values`).
    """
    shown = {}
    for name, value in values.items():
        if isinstance(value, str) and value.startswith("%") and value[1:] in values:
            value = values[value[1:]]
        shown[name] = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    return shown


def write_summary(model_dir: str, values: Dict[str, Any], state: str, step: int) -> None:
    """Writes `values` (bool, int, float or str), the run's `state` and its last `step` as the
    HParams summary of the run in `model_dir` (named by the model dir's base name).

    Args:
        model_dir: the run's model dir (its path).
        values: the operative values.
        state: how the run ended (e.g. complete, stopped, pruned).
        step: its last step.
    """
    from tensorboard.plugins.hparams import api as hp  # Only when a run ends.

    shown = tensorboard_values({**values, STATE: state, STEP: step})

    def write(summary_dir: str) -> None:
        writer = tf.summary.create_file_writer(summary_dir)
        with writer.as_default():
            hp.hparams(shown, trial_id=os.path.basename(os.path.normpath(model_dir)),
                       start_time_secs=None)
        writer.close()

    upload_written(model_dir, write)  # In an object store: locally, then uploaded.


class HParamsSummary(Hook):
    """Writes the run's operative gin values as an HParams summary at the end of training."""

    def on_trial_close(self, unused_logs) -> None:
        """Writes the summary into the model dir, with the run's end state and step.

        Args:
            unused_logs: the last evaluation's (or train loop's) results (not read).
        """
        state = END_STATE(self.run) if END_STATE is not None else None
        if state is None:
            state = "stopped" if self.run.stop.should_stop else "complete"
        path = self.run.directory.path
        arguments = (path, config.operative_values(), state, self.run.step)
        if is_object_store(path):  # A few requests: on the uploads' thread (the run waits at its end).
            uploads().submit(write_summary, *arguments)
        else:
            write_summary(*arguments)
