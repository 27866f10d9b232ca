"""Keras callbacks at ctl's seams, the one route for them: each evaluation is a test run and ends an "epoch".

    ctl.Experiment.hooks = [@ctl.hooks.KerasCallbacks()]
    ctl.hooks.KerasCallbacks.callbacks = [@keras.callbacks.CSVLogger()]   # gin.external_configurable

The calls `KerasCallbacks` makes, in-line and on a sidecar evaluator alike, are listed in its
docstring; docs/comforts.md says what a sidecar's callbacks see and how early stopping differs.
"""

from typing import Any, Dict, List, Sequence

import gin

from ctl.hooks.progress import scalars
from ctl.utils import console
from ctl.core.hook_protocol import Hook, Run


@gin.configurable(module="ctl.hooks")
class KerasCallbacks(Hook):
    """Runs `callbacks` as Keras' `fit` would, one epoch per evaluation, its test calls in each.

    The same calls wherever the evaluation runs, in-line (`train_and_eval`, `eval`) or on a
    sidecar evaluator (`continuous_eval`); all eager, on the host:

        bind                   set_model(model); on_train_begin({})
        each evaluation, for each eval set:
                               on_test_begin(); on_test_batch_begin(b),
                               on_test_batch_end(b) per batch b; on_test_end({eval results})
        after each evaluation  on_epoch_end(epoch, {last train loop's results,
                                                    val_<eval results>})
        the run's normal end   on_train_end(last results)

    The test calls come from the Trainer's evaluation itself (`eval_callbacks`); `on_epoch_end`
    runs in the process that owns the eval-side hooks (`ctl.model_dir.evaluator_role`). On a sidecar,
    `model` is the restored model and the epoch's logs hold only the `val_` entries. `epoch`
    counts this process's evaluations. A callback that sets `model.stop_training = True` (Keras'
    `EarlyStopping`, `TerminateOnNaN`) makes a ctl stop request; Keras' `EarlyStopping` counts in
    this process only (`ctl.hooks.EarlyStopping` keeps its count in the model dir). The callbacks
    must come from the same Keras as the model.

    Args:
        callbacks: Keras callbacks (`keras.callbacks.Callback`s, e.g. `@keras.callbacks.CSVLogger()`), called in
            order.
    """

    def __init__(self, callbacks: Sequence[Any] = ()):
        self.callbacks = list(callbacks)
        self._train_logs: Dict[str, float] = {}
        self._epoch = 0

    @property
    def eval_callbacks(self) -> List[Any]:
        """What the Trainer's evaluation calls per eval set and batch (`ctl.core.hook_protocol`)."""
        return self.callbacks

    def bind(self, run: Run) -> None:
        """Gives each callback the model and calls its `on_train_begin`.

        Args:
            run: the run's `ctl.hooks.Run` (model dir, model, step, stop request), kept as `self.run`.
        """
        super().bind(run)
        for callback in self.callbacks:
            if any(c.__name__ == "EarlyStopping" for c in type(callback).__mro__):
                console.warning(
                    "hooks", "%s counts its patience in this process only (a restart starts it "
                    "over); ctl.hooks.EarlyStopping keeps the count in the model dir "
                    "(docs/comforts.md).", type(callback).__name__)
            callback.set_model(run.model)
            callback.on_train_begin({})

    def on_train_loop_end(self, logs) -> None:
        """Keeps the loop's results for the next `on_epoch_end`.

        Args:
            logs: the train loop's results.
        """
        self._train_logs = scalars(logs)

    def on_eval_end(self, logs) -> None:
        """Ends an epoch: `on_epoch_end` with the train results and the evaluation's as `val_*`; stops the run if a
        callback set `model.stop_training`.

        Args:
            logs: the evaluation's results by metric name (named eval sets nested, `{set: {metric: value}}`).
        """
        epoch_logs = {**self._train_logs, **{f"val_{k}": v for k, v in scalars(logs).items()}}
        for callback in self.callbacks:
            callback.on_epoch_end(self._epoch, epoch_logs)
        self._epoch += 1
        if getattr(self.run.model, "stop_training", False):
            self.run.stop.request("a Keras callback set model.stop_training")

    def on_trial_close(self, logs) -> None:
        """Calls each callback's `on_train_end`.

        Args:
            logs: the last evaluation's (or train loop's) results.
        """
        for callback in self.callbacks:
            callback.on_train_end(scalars(logs))
