"""orbit's Controller, with a stop request and checkpoint hooks.

`orbit.Controller.train` runs until the global step reaches its target. ctl's
`Controller` also checks `stop.should_stop` after every train loop, and
`train_and_evaluate` after every evaluation: a stop request ends training at
the next boundary, with a final checkpoint. Everything runs eagerly on the host.

    train_and_evaluate(train_steps, eval_steps, eval_interval):
      while step < train_steps and not stop.should_stop:
        train(until the next eval boundary)   # stops early on a request
        evaluate(eval_steps)                  # eval actions may request a stop
      save checkpoint                          # on_checkpoint_end(path)
"""

from typing import Callable, Iterable, Optional

from absl import logging
import orbit

from ctl.hooks import StopRequest


class Controller(orbit.Controller):
    """An `orbit.Controller` that honours a `StopRequest` and reports checkpoints."""

    def __init__(self, *args, stop: Optional[StopRequest] = None,
                 on_checkpoint_end: Iterable[Callable[[str], None]] = (),
                 on_checkpoint_load: Iterable[Callable[[str], None]] = (), **kwargs):
        self.stop = stop or StopRequest()
        self._on_checkpoint_end = tuple(on_checkpoint_end)
        self._on_checkpoint_load = tuple(on_checkpoint_load)
        super().__init__(*args, **kwargs)  # Restores the latest checkpoint.

    def restore_checkpoint(self, checkpoint_path: Optional[str] = None):
        path = super().restore_checkpoint(checkpoint_path)
        if path:
            for action in self._on_checkpoint_load:
                action(path)
        return path

    def train(self, steps: int, checkpoint_at_completion: bool = True):
        self._require("trainer", for_method="train")
        current_step = int(self.global_step.numpy())
        logging.info("train | step: %6d | training until step %d...", current_step, steps)
        while current_step < steps and not self.stop.should_stop:
            self._train_n_steps(min(steps - current_step, self.steps_per_loop))
            self._save(check_interval=True)
            current_step = int(self.global_step.numpy())
        if checkpoint_at_completion or self.stop.should_stop:
            self._save(check_interval=False)
        self._sync_on_async_checkpointing()

    def train_and_evaluate(self, train_steps: int, eval_steps: int = -1,
                           eval_interval: Optional[int] = None):
        self._require("trainer", for_method="train_and_evaluate")
        self._require("evaluator", for_method="train_and_evaluate")
        output = None
        current_step = int(self.global_step.numpy())
        eval_interval = eval_interval or (train_steps - current_step)
        while current_step < train_steps and not self.stop.should_stop:
            target = min(train_steps, current_step + eval_interval)
            self.train(steps=target, checkpoint_at_completion=False)
            output = self.evaluate(steps=eval_steps)
            current_step = int(self.global_step.numpy())
        if self.stop.should_stop:
            logging.info("train | step: %6d | stopped: %s", current_step, self.stop.reason)
        self._save(check_interval=False)
        self._sync_on_async_checkpointing()
        return output

    def save_checkpoint(self):
        self._require("checkpoint_manager", for_method="save_checkpoint")
        self._save(check_interval=False)

    def _save(self, check_interval: bool) -> bool:
        saved = self._maybe_save_checkpoint(check_interval=check_interval)
        if saved and self._on_checkpoint_end:
            # Hooks read the checkpoint's files: with async saving, wait for them.
            self._sync_on_async_checkpointing()
            path = self.checkpoint_manager.last_saved_path
            for action in self._on_checkpoint_end:
                action(path)
        return saved
