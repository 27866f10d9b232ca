"""orbit's Controller, with a stop request, checkpoint hooks and a leaner train loop.

`orbit.Controller.train` runs until the global step reaches its target. ctl's
`Controller` also checks `stop.should_stop` after every train loop, and
`train_and_evaluate` after every evaluation: a stop request ends training at
the next boundary, with a final checkpoint. Everything runs eagerly on the host.

What happens after each train loop is ctl's own (`_train_n_steps`): orbit's
spends about 2 ms of host time there (global-step reads, two summary-writer
flushes, a summary op, a pretty-printed output), 10% of a 100-step loop of a
small model. ctl's takes the loop's results and the global step from the
value the loop's own `tf.function` call returns (`ctl.core.trainer.TrainLoopEnd`),
keeps the summaries for a flush at most once a second (`ctl.core.summaries`)
and prints the same line. Measured with `python -m bench.run --only
train_throughput`.

The controller is the one owner of "the current step" on the host
(`Controller.step`): it takes it from each loop's `TrainLoopEnd`, after the
`after_train_loop` handlers (the fault handler) had their say, and from the
global step after every restore. A handler that restores a checkpoint returns
the end with the restored step, so the next loop, the summaries and the hooks
all work from that step; nothing else keeps a copy that could go stale.

    train_and_evaluate(train_steps, eval_steps, eval_interval):
      while step < train_steps and not stop.should_stop:
        train(until the next eval boundary)   # stops early on a request
          per loop: end = trainer.train(n); end = handler(end) for each
                    after_train_loop handler; step = end.step; train actions
        evaluate(eval_steps)                  # eval actions may request a stop
      save checkpoint                          # on_checkpoint_end(path)
"""

import time
from typing import Callable, Iterable, Optional

from absl import logging
import orbit
import tensorflow as tf

from ctl.core.hooks import StopRequest
from ctl.core.trainer import TrainLoopEnd

AfterTrainLoop = Callable[[TrainLoopEnd], TrainLoopEnd]


class Controller(orbit.Controller):
    """An `orbit.Controller` that honours a `StopRequest` and reports checkpoints."""

    def __init__(self, *args, stop: Optional[StopRequest] = None,
                 after_train_loop: Iterable[AfterTrainLoop] = (),
                 on_checkpoint_end: Iterable[Callable[[str], None]] = (),
                 on_checkpoint_load: Iterable[Callable[[str], None]] = (), **kwargs):
        """`after_train_loop`: functions from a loop's `TrainLoopEnd` to the end
        to go on from, run in order before the train actions (they may raise,
        or restore a checkpoint and return `end._replace(step=..., restored=path)`)."""
        self.stop = stop or StopRequest()
        self.after_train_loop = tuple(after_train_loop)
        self._on_checkpoint_end = tuple(on_checkpoint_end)
        self._on_checkpoint_load = tuple(on_checkpoint_load)
        self._step: Optional[int] = None
        super().__init__(*args, **kwargs)  # Restores the latest checkpoint.

    @property
    def step(self) -> int:
        """The global step as of the last train loop or restore (a host value)."""
        if self._step is None:
            self._step = int(self.global_step.numpy())
        return self._step

    def restore_checkpoint(self, checkpoint_path: Optional[str] = None):
        path = super().restore_checkpoint(checkpoint_path)
        self._step = int(self.global_step.numpy())  # Restored, or initialized.
        if path:
            self._loaded(path)
        return path

    def _loaded(self, path: str) -> None:
        for action in self._on_checkpoint_load:
            action(path)

    def train(self, steps: int, checkpoint_at_completion: bool = True):
        self._require("trainer", for_method="train")
        current_step = self.step
        logging.info("train | step: %6d | training until step %d...", current_step, steps)
        self._last_loop_end = (time.perf_counter(), current_step)
        try:
            while current_step < steps and not self.stop.should_stop:
                current_step = self._train_n_steps(min(steps - current_step, self.steps_per_loop))
                if self.checkpoint_manager is not None and self.checkpoint_manager.due(current_step):
                    self._save(check_interval=True)
        finally:
            self.summary_manager.flush()
        if checkpoint_at_completion or self.stop.should_stop:
            self._save(check_interval=False)
        self._sync_on_async_checkpointing()

    def _train_n_steps(self, num_steps: int) -> int:
        """Runs one train loop, its `after_train_loop` handlers and train actions; returns the step.

        orbit's does the same; this one runs no eager TensorFlow op: the loop
        hands back its results and the global step (see the module docstring).
        """
        if self.summary_interval:  # For tf.summary calls inside the train step.
            with self.summary_manager.summary_writer().as_default(), tf.summary.record_if(
                    lambda: self.global_step % self.summary_interval == 0):
                end = self.trainer.train(tf.constant(num_steps, tf.int32))
        else:
            end = self.trainer.train(tf.constant(num_steps, tf.int32))
        if not isinstance(end, TrainLoopEnd):  # Another orbit.AbstractTrainer: read the step.
            end = TrainLoopEnd(end or {}, int(self.global_step.numpy()))
        last_time, last_step = self._last_loop_end
        if end.step != last_step + num_steps and not self.stop.should_stop and end.bad_step is None:
            logging.warning("trainer.train(%d) moved the global step from %d to %d.",
                            num_steps, last_step, end.step)
        for handler in self.after_train_loop:
            end = handler(end)
        self._step = end.step
        if end.restored:
            self._loaded(end.restored)
        output = to_numpy(end.logs or {})
        now = time.perf_counter()
        self._last_loop_end = (now, end.step)
        for action in self.train_actions:
            action(output)
        steps_per_second = max(end.step - last_step, 0) / max(now - last_time, 1e-9)
        # orbit's line, on stdout; ctl.comforts.progress logs its own line with the ETA.
        print(f"train | step: {end.step: 6d} | steps/sec: {steps_per_second: 6.1f} | "
              f"output: {_format(output)}")
        self.summary_manager.write_summaries(
            {**output, "steps_per_second": steps_per_second}, step=end.step)
        self.summary_manager.flush_if_due()
        return end.step

    def train_and_evaluate(self, train_steps: int, eval_steps: int = -1,
                           eval_interval: Optional[int] = None):
        self._require("trainer", for_method="train_and_evaluate")
        self._require("evaluator", for_method="train_and_evaluate")
        output = None
        current_step = self.step
        eval_interval = eval_interval or (train_steps - current_step)
        while current_step < train_steps and not self.stop.should_stop:
            target = min(train_steps, current_step + eval_interval)
            self.train(steps=target, checkpoint_at_completion=False)
            output = self.evaluate(steps=eval_steps)
            current_step = self.step
        if self.stop.should_stop:
            logging.info("train | step: %6d | stopped: %s", current_step, self.stop.reason)
        self._save(check_interval=False)
        self._sync_on_async_checkpointing()
        return output

    def evaluate(self, steps: int = -1):
        """Runs one evaluation of `steps` batches (-1: the whole eval set); returns NumPy results.

        orbit's, with the same lines and summaries, and the host work after
        the loop cut as in `_train_n_steps`.
        """
        self._require("evaluator", for_method="evaluate")
        if steps <= 0 and steps != -1:
            raise ValueError(f"`steps` ({steps}) should be > 0, or == -1.")
        step = self.step
        what = f"running {steps} steps of evaluation..." if steps > 0 else "running complete evaluation..."
        print(f" eval | step: {step: 6d} | {what}")
        start = time.perf_counter()
        with self.eval_summary_manager.summary_writer().as_default():  # For tf.summary calls.
            output = self.evaluator.evaluate(tf.constant(steps, tf.int32))
        elapsed = time.perf_counter() - start
        output = to_numpy(output or {})
        for action in self.eval_actions:
            action(output)
        rate = ""
        if steps > 0:
            output["steps_per_second"] = steps / elapsed
            rate = f"steps/sec: {steps / elapsed: 6.1f} | "
        print(f" eval | step: {step: 6d} | {rate}eval time: {elapsed: 6.1f} sec | "
              f"output: {_format(output)}")
        self.eval_summary_manager.write_summaries(output, step=step)
        self.eval_summary_manager.flush()
        return output

    def save_checkpoint(self):
        self._require("checkpoint_manager", for_method="save_checkpoint")
        self._save(check_interval=False)

    def _save(self, check_interval: bool) -> bool:
        if self.summary_manager is not None:  # A checkpoint's steps have their summaries on disk.
            self.summary_manager.flush()
        saved = self._maybe_save_checkpoint(check_interval=check_interval)
        if saved and self._on_checkpoint_end:
            # Hooks read the checkpoint's files: with async saving, wait for them.
            self._sync_on_async_checkpointing()
            path = self.checkpoint_manager.last_saved_path
            for action in self._on_checkpoint_end:
                action(path)
        return saved


def to_numpy(logs):
    """`logs` with every tensor as a NumPy value (`tf.nest.map_structure` costs 0.15 ms here)."""
    if isinstance(logs, dict):
        return {name: to_numpy(value) for name, value in logs.items()}
    return logs.numpy() if tf.is_tensor(logs) else logs


def _format(output) -> str:
    """`{name: value, ...}` on one line, scalars with 5 significant digits."""
    if not isinstance(output, dict):
        try:
            return f"{float(output):.5g}"
        except (TypeError, ValueError):
            return repr(output)
    return "{" + ", ".join(f"{name}: {_format(value)}" for name, value in output.items()) + "}"
