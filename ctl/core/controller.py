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
and logs its line through `ctl.core.console` (orbit prints its own lines; ctl
has one format). Measured with `python -m bench.run --only
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

import orbit
import tensorflow as tf

from ctl.core import console
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
        self._train_lines = console.TrainLines()  # Rate and ETA from steady-state loops.
        self._final_step = None  # What train_and_evaluate trains to, for the ETA.
        self._save_options = tf.train.CheckpointOptions(
            enable_async=kwargs.get("enable_async_checkpointing", False))
        # orbit's __init__ would restore and print its own lines; ctl restores below.
        manager = kwargs.pop("checkpoint_manager", None)
        super().__init__(*args, checkpoint_manager=None, **kwargs)
        self.checkpoint_manager = manager
        if manager is not None:
            self.restore_checkpoint()

    @property
    def step(self) -> int:
        """The global step as of the last train loop or restore (a host value)."""
        if self._step is None:
            self._step = int(self.global_step.numpy())
        return self._step

    def restore_checkpoint(self, checkpoint_path: Optional[str] = None):
        """orbit's, with ctl's console line and the `on_checkpoint_load` hooks."""
        if self.checkpoint_manager is None:
            raise ValueError("restore_checkpoint needs a checkpoint_manager.")
        with self.strategy.scope():
            if checkpoint_path is not None:
                self.checkpoint_manager.checkpoint.restore(checkpoint_path)
            else:
                checkpoint_path = self.checkpoint_manager.restore_or_initialize()
        self._step = int(self.global_step.numpy())  # Restored, or initialized.
        if checkpoint_path:
            self._loaded(checkpoint_path)
        else:
            self._train_lines.restart()
            console.info("ckpt", "no checkpoint in %s: initialized the model",
                         self.checkpoint_manager.directory, step=self._step)
        return checkpoint_path

    def _loaded(self, path: str) -> None:
        self._train_lines.restart()
        console.info("ckpt", "restored model from %s", path, step=self.step)
        for action in self._on_checkpoint_load:
            action(path)

    def train(self, steps: int, checkpoint_at_completion: bool = True):
        self._require("trainer", for_method="train")
        current_step = self.step
        self._last_loop_end = (time.perf_counter(), current_step)
        try:
            while current_step < steps and not self.stop.should_stop:
                current_step = self._train_n_steps(min(steps - current_step, self.steps_per_loop),
                                                   stretch_end=steps)
                if self.checkpoint_manager is not None and self.checkpoint_manager.due(current_step):
                    self._save(check_interval=True)
        finally:
            self.summary_manager.flush()
        if checkpoint_at_completion or self.stop.should_stop:
            self._save(check_interval=False)
        self._sync_on_async_checkpointing()

    def _train_n_steps(self, num_steps: int, stretch_end: Optional[int] = None) -> int:
        """Runs one train loop, its `after_train_loop` handlers and train actions; returns the step.

        orbit's does the same; this one runs no eager TensorFlow op: the loop
        hands back its results and the global step (see the module docstring).
        `stretch_end`: the step this stretch of training ends at (for the console).
        """
        started = time.perf_counter()
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
            console.warning("train", "trainer.train(%d) moved the global step from %d to %d.",
                            num_steps, last_step, end.step, step=end.step)
        for handler in self.after_train_loop:
            end = handler(end)
        self._step = end.step
        if end.restored:
            self._loaded(end.restored)
        output = to_numpy(end.logs or {})
        now = time.perf_counter()
        loop_seconds = now - started
        self._last_loop_end = (now, end.step)
        for action in self.train_actions:
            action(output)
        steps_per_second = max(end.step - last_step, 0) / max(now - last_time, 1e-9)
        stretch_end = stretch_end or end.step
        self._train_lines.loop_end(end.step, max(self._final_step or 0, stretch_end), output,
                                   num_steps, loop_seconds,
                                   last=end.step >= stretch_end or self.stop.should_stop)
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
        self._final_step = train_steps
        while current_step < train_steps and not self.stop.should_stop:
            target = min(train_steps, current_step + eval_interval)
            self.train(steps=target, checkpoint_at_completion=False)
            output = self.evaluate(steps=eval_steps)
            current_step = self.step
        if self.stop.should_stop:
            console.info("train", "stopped: %s", self.stop.reason, step=current_step)
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
            rate = f" ({steps / elapsed:.1f} steps/sec)"
        console.info("eval", "%s | %.2f sec%s", console.format_logs(output), elapsed, rate,
                     step=step)
        self.eval_summary_manager.write_summaries(output, step=step)
        self.eval_summary_manager.flush()
        return output

    def save_checkpoint(self):
        self._require("checkpoint_manager", for_method="save_checkpoint")
        self._save(check_interval=False)

    def _save(self, check_interval: bool) -> bool:
        if self.summary_manager is not None:  # A checkpoint's steps have their summaries on disk.
            self.summary_manager.flush()
        if self.checkpoint_manager is None:
            return False
        path = self.checkpoint_manager.save(check_interval=check_interval,
                                            options=self._save_options)
        if path is None:
            return False
        console.info("ckpt", "saved %s", path, step=self.step)
        if self._on_checkpoint_end:
            # Hooks read the checkpoint's files: with async saving, wait for them.
            self._sync_on_async_checkpointing()
            for action in self._on_checkpoint_end:
                action(path)
        return True


def to_numpy(logs):
    """`logs` with every tensor as a NumPy value (`tf.nest.map_structure` costs 0.15 ms here)."""
    if isinstance(logs, dict):
        return {name: to_numpy(value) for name, value in logs.items()}
    return logs.numpy() if tf.is_tensor(logs) else logs

