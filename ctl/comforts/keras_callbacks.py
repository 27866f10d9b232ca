"""Keras callbacks at ctl's seams, the one route for them: each evaluation is a test run and ends an "epoch".

    ctl.Experiment.hooks = [@ctl.hooks.KerasCallbacks()]
    ctl.hooks.KerasCallbacks.callbacks = [@keras.callbacks.EarlyStopping()]   # gin.external_configurable

The same calls wherever the evaluation runs, in-line (`train_and_eval`,
`eval`) or on a sidecar evaluator (`continuous_eval`); all eager, on the host:

    bind                       set_model(model); on_train_begin({})
    each evaluation, for each eval set:
                               on_test_begin(); on_test_batch_begin(b), on_test_batch_end(b)
                               per batch b; on_test_end({eval results})
    after each evaluation      on_epoch_end(epoch, {last train loop's results, val_<eval results>})
    the run's normal end       on_train_end(last results)

The test calls come from the Trainer's evaluation itself (`eval_callbacks`: its
host loop, one call per batch); `on_epoch_end` is an eval-side hook action, run
by the process that owns the eval-side hooks (`ctl.model_dir.evaluator_role`). On a
sidecar, `model` is the restored model, the epoch's logs hold only the `val_`
entries (it trains nothing), and the run's end is the sidecar's (the trainer's
final checkpoint evaluated, or `max_evaluations`). `epoch` counts this
process's evaluations.

A callback that sets `model.stop_training = True` (Keras' `EarlyStopping`,
`TerminateOnNaN`) makes a ctl stop request (in-line; a sidecar follows its
trainer). The callbacks must come from the same Keras as the model.

Early stopping has one route, `ctl.hooks.EarlyStopping` (its count survives a
restart, in the model dir); Keras' `EarlyStopping` here still stops the run
through the same stop request, but counts in this process only, and says so
once when bound.
"""

from typing import Any, Dict, List, Sequence

import gin

from ctl.comforts.progress import scalars
from ctl.utils import console
from ctl.core.hook_protocol import Hook, Run


@gin.configurable(module="ctl.hooks")
class KerasCallbacks(Hook):
    """Runs `callbacks` as Keras' `fit` would, one epoch per evaluation, its test calls in each."""

    def __init__(self, callbacks: Sequence[Any] = ()):
        self.callbacks = list(callbacks)
        self._train_logs: Dict[str, float] = {}
        self._epoch = 0

    @property
    def eval_callbacks(self) -> List[Any]:
        """What the Trainer's evaluation calls per eval set and batch (`ctl.core.hook_protocol`)."""
        return self.callbacks

    def bind(self, run: Run) -> None:
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
        self._train_logs = scalars(logs)

    def on_eval_end(self, logs) -> None:
        epoch_logs = {**self._train_logs, **{f"val_{k}": v for k, v in scalars(logs).items()}}
        for callback in self.callbacks:
            callback.on_epoch_end(self._epoch, epoch_logs)
        self._epoch += 1
        if getattr(self.run.model, "stop_training", False):
            self.run.stop.request("a Keras callback set model.stop_training")

    def on_trial_close(self, logs) -> None:
        for callback in self.callbacks:
            callback.on_train_end(scalars(logs))
