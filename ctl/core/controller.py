"""ctl's Controller: train, evaluate and checkpoint, on orbit's runner protocol.

It drives any `orbit.AbstractTrainer` and `orbit.AbstractEvaluator` (ctl's `Trainer`, orbit's
`StandardTrainer`) with orbit's interface (`train`, `evaluate`, `train_and_evaluate`,
`save_checkpoint`, `restore_checkpoint`, train and eval actions), and adds a stop request
checked after every loop and evaluation, checkpoint hooks, and host bookkeeping that costs no
eager TensorFlow op. Its constructor takes orbit's familiar arguments and the rest in three
groups: `Checkpoints` (defined beside the `CheckpointManager`, in `ctl.core.checkpointing`),
`Summaries` (beside the `SummaryManager`, in `ctl.core.summaries`) and `BetweenLoops`; import
all three from here. It is the one owner of the current step on the host (`Controller.step`).
Everything runs eagerly on the host.

Why ctl has its own, and `train_and_evaluate` as pseudo-code: docs/explanation/training-loop.md.
"""

import contextlib
import dataclasses
import time
from typing import Callable, Iterator, Optional, Sequence, Union

import tensorflow as tf

from ctl import compat
from ctl.utils import console
from ctl.core.checkpointing import CheckpointManager, Checkpoints
from ctl.core.stop import StopRequest
from ctl.core.summaries import SummaryManager, Summaries
from ctl.core.runner import EvaluationEnd, TrainLoopEnd

AfterTrainLoop = Callable[[TrainLoopEnd], TrainLoopEnd]
Action = Callable[[dict], None]


@dataclasses.dataclass(frozen=True)
class BetweenLoops:
    """What the Controller runs on the host between loops, in this order, and the stop it heeds.

    Args:
        after_train_loop: functions from a loop's `TrainLoopEnd` to the end to go on
            from (they may raise, or restore a checkpoint and return
            `end._replace(step=..., restored=path)`); run first.
        train_actions: then these, with the loop's results.
        eval_actions: after each evaluation, with its results.
        stop: checked after every train loop and evaluation (None: a `StopRequest` of
            the Controller's own).
        before_writing: called with the step before the train actions and before each
            checkpoint save: waits until the run may write (its checks passed, its model dir
            held) or raises. A train loop's line and summaries come before it: a run whose
            checks end after its first loop reports that loop as soon as it ends.
    """

    after_train_loop: Sequence[AfterTrainLoop] = ()
    train_actions: Sequence[Action] = ()
    eval_actions: Sequence[Action] = ()
    stop: Optional[StopRequest] = None
    before_writing: Optional[Callable[[int], None]] = None


class Controller:
    """Runs an orbit trainer and evaluator: loops, checkpoints, summaries, a stop request."""

    def __init__(self, *, global_step: tf.Variable, trainer=None, evaluator=None,
                 strategy: Optional[tf.distribute.Strategy] = None,
                 steps_per_loop: Optional[Union[int, Callable[[int], int]]] = None,
                 checkpoints: Checkpoints = Checkpoints(),
                 summaries: Summaries = Summaries(),
                 between_loops: BetweenLoops = BetweenLoops()):
        """Restores the latest checkpoint of `checkpoints.manager` (or initializes).

        Args:
            global_step: the step variable the loops advance.
            trainer: an `orbit.AbstractTrainer` (ctl's `Trainer`), or None to only evaluate.
            evaluator: an `orbit.AbstractEvaluator` (ctl's `Trainer`), or None to only train.
            strategy: the strategy the loops run under (None: the current one).
            steps_per_loop: the steps of each train loop, or, as orbit's, a function from
                the global step to the next loop's steps.
            checkpoints: who saves and restores checkpoints, and who hears of it.
            summaries: where the loops' results are written.
            between_loops: what runs on the host between loops, and the stop it heeds.

        Raises:
            ValueError: neither a trainer nor an evaluator, or a `steps_per_loop` or
                `summaries.interval` that cannot work.
            TypeError: a group passed as something other than its class.
        """
        if trainer is None and evaluator is None:
            raise ValueError("`trainer` and `evaluator` should not both be None.")
        if trainer is not None and not callable(steps_per_loop) and (
                isinstance(steps_per_loop, bool) or not isinstance(steps_per_loop, int) or
                steps_per_loop < 1):
            raise ValueError(f"`steps_per_loop` ({steps_per_loop}) must be a positive integer "
                             "or a function of the global step.")
        for name, value, kind in (("checkpoints", checkpoints, Checkpoints),
                                  ("summaries", summaries, Summaries),
                                  ("between_loops", between_loops, BetweenLoops)):
            if not isinstance(value, kind):
                raise TypeError(f"`{name}` ({value!r}) must be a {__name__}.{kind.__name__}; "
                                f"wrap it: {name}={kind.__name__}(...).")
        interval = summaries.interval
        if interval is not None and (interval < 1 or (
                not callable(steps_per_loop) and interval % (steps_per_loop or 1))):
            raise ValueError(f"`summaries.interval` ({interval}) must be a positive "
                             f"multiple of `steps_per_loop` ({steps_per_loop}).")
        self.trainer = trainer
        self.evaluator = evaluator
        self.strategy = strategy or tf.distribute.get_strategy()
        self.global_step = global_step
        self.steps_per_loop = steps_per_loop
        # The groups, with their defaults filled in.
        self.checkpoints = dataclasses.replace(checkpoints, on_end=tuple(checkpoints.on_end),
                                               on_load=tuple(checkpoints.on_load))
        self.summaries = dataclasses.replace(
            summaries, train=summaries.train or SummaryManager(None, global_step),
            eval=summaries.eval or SummaryManager(None, global_step))
        self.between_loops = BetweenLoops(
            tuple(between_loops.after_train_loop), tuple(between_loops.train_actions),
            tuple(between_loops.eval_actions), between_loops.stop or StopRequest(),
            between_loops.before_writing)
        self._save_options = tf.train.CheckpointOptions(enable_async=checkpoints.asynchronous)
        if checkpoints.asynchronous and checkpoints.manager is not None:
            compat.share_keras_cpu_twins(
                tf.train.TrackableView(checkpoints.manager.checkpoint).descendants())
        self._step: Optional[int] = None
        self._train_lines = console.TrainLines()  # Rate and ETA from steady-state loops.
        self._final_step: Optional[int] = None  # What train_and_evaluate trains to, for the ETA.
        self._loop_sizes = {}  # num_steps -> its tensor, made once (an eager op a loop otherwise).
        tf.summary.experimental.set_step(global_step)  # For tf.summary calls without a step.
        if checkpoints.manager is not None:
            self.restore_checkpoint()

    # orbit's Controller's names for the managers.

    @property
    def checkpoint_manager(self) -> Optional[CheckpointManager]:
        return self.checkpoints.manager

    @property
    def summary_manager(self) -> SummaryManager:
        return self.summaries.train

    @property
    def eval_summary_manager(self) -> SummaryManager:
        return self.summaries.eval

    @property
    def step(self) -> int:
        """The global step as of the last train loop or restore (a host value)."""
        if self._step is None:
            self._step = int(self.global_step.numpy())
        return self._step

    def refresh_step(self) -> int:
        """Reads the global step afresh, after something other than this controller moved it."""
        self._step = None
        return self.step

    def restore_checkpoint(self, checkpoint_path: Optional[str] = None) -> Optional[str]:
        """Restores `checkpoint_path`, or the latest checkpoint (or initializes); returns the path.

        Args:
            checkpoint_path: a checkpoint's prefix; None: the latest in the model dir.

        Returns:
            The path restored, or None when it initialized.
        """
        self._require("checkpoint_manager", "restore_checkpoint")
        with self.strategy.scope():
            if checkpoint_path is not None:
                self.checkpoint_manager.checkpoint.restore(checkpoint_path)
                path = checkpoint_path
            else:
                path = self.checkpoint_manager.restore_or_initialize()
        self._step = int(self.global_step.numpy())  # Restored, or initialized.
        if path:
            self._loaded(path)
        else:
            self._train_lines.restart()
            console.info("ckpt", "no checkpoint in %s: initialized the model",
                         self.checkpoint_manager.directory, step=self._step)
        return path

    def _loaded(self, path: str) -> None:
        self._train_lines.restart()  # The next loop traces again.
        console.info("ckpt", "restored model from %s", path, step=self.step)
        for action in self.checkpoints.on_load:
            action(path)

    def train(self, steps: int, checkpoint_at_completion: bool = True):
        """Trains to global step `steps`, in loops of `steps_per_loop`, saving checkpoints on the way.

        Args:
            steps: the global step to train to.
            checkpoint_at_completion: save a checkpoint (and wait for it) at the end; False when training goes on
                after this call.
        """
        self._require("trainer", "train")
        current_step = self.refresh_step()  # Whoever calls may have moved the global step.
        self._last_loop_end = (time.perf_counter(), current_step)
        try:
            while current_step < steps and not self.between_loops.stop.should_stop:
                current_step = self._train_n_steps(
                    min(steps - current_step, self._loop_steps(current_step)), stretch_end=steps)
                if self._checkpoint_may_be_due(current_step):
                    self._save(check_interval=True)
        except BaseException:
            self.flush_summaries()  # What led up to the error is on disk.
            raise
        if checkpoint_at_completion or self.between_loops.stop.should_stop:  # The end of training.
            self.flush_summaries()
            self._save(check_interval=False)
            self._wait_for_checkpoints()
        else:  # Training goes on after this call (train_and_evaluate): the once-a-second flush.
            # An asynchronous checkpoint is written meanwhile: beside the evaluation that
            # follows (whose actions wait for it), the next save, a restore or the end.
            self.summary_manager.flush_if_due()

    def _train_n_steps(self, num_steps: int, stretch_end: Optional[int] = None) -> int:
        """Runs one train loop, its `after_train_loop` handlers and train actions; returns the step.

        orbit's does the same; this one runs no eager TensorFlow op: the loop
        hands back its results and the global step (docs/explanation/training-loop.md).
        `stretch_end`: the step this stretch of training ends at (for the console).
        """
        started = time.perf_counter()
        loop_size = self._loop_size(num_steps)
        with self.train_loop_context():
            end = self.trainer.train(loop_size)
        if not isinstance(end, TrainLoopEnd):  # Another orbit.AbstractTrainer: read the step.
            end = TrainLoopEnd(end or {}, int(self.global_step.numpy()))
        last_time, last_step = self._last_loop_end
        stop = self.between_loops.stop
        if end.step != last_step + num_steps and not stop.should_stop and end.bad_step is None:
            console.warning("train", "trainer.train(%d) moved the global step from %d to %d.",
                            num_steps, last_step, end.step, step=end.step)
        for handler in self.between_loops.after_train_loop:
            end = handler(end)
        self._step = end.step
        if end.restored:
            self._loaded(end.restored)
        output = to_numpy(end.logs or {})
        now = time.perf_counter()
        loop_seconds = now - started
        self._last_loop_end = (now, end.step)
        steps_per_second = max(end.step - last_step, 0) / max(now - last_time, 1e-9)
        stretch_end = stretch_end or end.step
        last = end.step >= stretch_end or stop.should_stop
        self._train_lines.loop_end(end.step, max(self._final_step or 0, stretch_end), output,
                                   num_steps, loop_seconds, last=last)
        self.summary_manager.write_summaries(
            {**output, "steps_per_second": steps_per_second}, step=end.step)
        self.summary_manager.flush_if_due()
        self.eval_summary_manager.flush_if_due()
        self._before_writing()
        for action in self.between_loops.train_actions:
            action(output)
        if stop.should_stop and not last:  # An action asked to stop: the stretch ends here.
            self._train_lines.say_skipped()
        return end.step

    def _before_writing(self) -> None:
        if self.between_loops.before_writing is not None:
            self.between_loops.before_writing(self.step)

    @contextlib.contextmanager
    def train_loop_context(self) -> Iterator[None]:
        """What a train loop runs (and is traced) under: with `Summaries.interval`, the train
        summaries' writer as the default and a record condition on the global step, for the
        train step's own `tf.summary` calls."""
        if not self.summaries.interval:
            yield
            return
        with self.summary_manager.summary_writer().as_default(), tf.summary.record_if(
                lambda: self.global_step % self.summaries.interval == 0):
            yield

    def _loop_steps(self, step: int) -> int:
        """The steps of the train loop that starts at `step`: up to the next multiple of
        `steps_per_loop` (or what its function says). A run resumed between multiples (a
        signal's checkpoint) first runs the rest of its loop, so that its loops end, and its
        summaries, checkpoints and per-loop metric states fall, where an uninterrupted run's do."""
        if callable(self.steps_per_loop):
            return self.steps_per_loop(step)
        return self.steps_per_loop - step % self.steps_per_loop

    def _checkpoint_may_be_due(self, step: int) -> bool:
        """Whether to ask the manager for a save at `step`: ctl's says without a TensorFlow op
        (`due`); another decides in `save(check_interval=True)`."""
        manager = self.checkpoint_manager
        if manager is None:
            return False
        return manager.due(step) if isinstance(manager, CheckpointManager) else True

    def _loop_size(self, num_steps: int) -> tf.Tensor:
        """`num_steps` as a tensor, made once per value (an eager op a loop otherwise)."""
        loop_size = self._loop_sizes.get(num_steps)
        if loop_size is None:
            loop_size = self._loop_sizes[num_steps] = tf.constant(num_steps, tf.int32)
        return loop_size

    def train_and_evaluate(self, train_steps: int, eval_steps: int = -1,
                           eval_interval: Optional[int] = None,
                           skip_evaluation: Callable[[int], bool] = lambda step: False):
        """Trains to `train_steps`, evaluating on the way; returns the last evaluation's results.

        Evaluations fall on the multiples of `eval_interval` of the global step
        and on `train_steps` (`next_evaluation`), whatever step the run started
        from, as checkpoints do: a run stopped and resumed any number of times
        evaluates at the same steps as one that ran straight through. A run that
        starts on such a step evaluates there first (it stopped between its last
        train loop and that evaluation), unless `skip_evaluation(step)`, which
        is asked before every evaluation (`ctl.train_lib`: one is on record
        there, or a sidecar evaluator serves the model dir). Returns the last
        evaluation's results, or None if it evaluated nothing.

        Args:
            train_steps: the global step to train to.
            eval_steps: batches per evaluation (-1: the whole eval set).
            eval_interval: evaluate at each multiple of it of the global step (None: only at the end).
            skip_evaluation: asked with the step before every evaluation; True skips it.
        """
        self._require("trainer", "train_and_evaluate")
        self._require("evaluator", "train_and_evaluate")
        output = None
        current_step = self.refresh_step()
        self._final_step = train_steps
        at_the_end = current_step >= train_steps  # (With train_steps = 0: an evaluation at 0.)
        on_a_multiple = bool(current_step and eval_interval and current_step % eval_interval == 0)
        if (at_the_end or on_a_multiple) and not skip_evaluation(current_step):
            output = self.evaluate(steps=eval_steps)
        while current_step < train_steps and not self.between_loops.stop.should_stop:
            self.train(steps=next_evaluation(current_step, eval_interval, train_steps),
                       checkpoint_at_completion=False)
            current_step = self.step
            if not skip_evaluation(current_step):
                output = self.evaluate(steps=eval_steps)
        if self.between_loops.stop.should_stop:
            console.info("train", "stopped: %s", self.between_loops.stop.reason, step=current_step)
        self.flush_summaries()  # The last loops' results are on disk, with or without a checkpoint.
        self._save(check_interval=False)
        self._wait_for_checkpoints()
        return output

    def evaluate(self, steps: int = -1):
        """Runs one evaluation of `steps` batches (-1: the whole eval set); returns NumPy results.

        orbit's, with the same lines and summaries, and the host work after
        the loop cut as in `_train_n_steps`. The eval summaries' writer is the
        default for the evaluation (the eval steps' own `tf.summary` calls);
        the results are kept and written with one call and one flush as that
        context ends (`SummaryManager.writing()`), so they are on disk when
        this returns. `steps_per_second` is kept for the next flush (after a
        train loop, at a checkpoint, at the end: `flush_summaries`): over the
        batches read, which ctl's evaluator says (`EvaluationEnd`: fewer than
        `steps` where an eval set ended first, which the console line says too).

        Args:
            steps: batches to evaluate (-1: the whole eval set).
        """
        self._require("evaluator", "evaluate")
        if steps <= 0 and steps != -1:
            raise ValueError(f"`steps` ({steps}) should be > 0, or == -1.")
        step = self.step
        summaries = self.eval_summary_manager
        start = time.perf_counter()
        with summaries.writing():  # The default for the eval steps; flushed at its end.
            end = self.evaluator.evaluate(self._loop_size(steps))
            elapsed = time.perf_counter() - start
            output = to_numpy(end or {})
            summaries.write_summaries(output, step=step)
        # Another orbit evaluator does not say what it read: the steps asked for.
        read = end.steps if isinstance(end, EvaluationEnd) and end.steps is not None else steps
        ended = isinstance(end, EvaluationEnd) and end.data_ended
        # The results are on disk now; the rate is kept for the next flush (`flush_summaries`).
        rate = {"steps_per_second": read / elapsed} if steps > 0 else {}
        if rate:
            summaries.write_summaries(rate, step=step)
        # An async write ran beside the evaluation; actions may read the checkpoint's values
        # (an upload to an object store goes on meanwhile).
        self._wait_for_checkpoints(uploaded=False)
        for action in self.between_loops.eval_actions:
            action(output)
        output.update(rate)
        console.info("eval", "%s | %.2f sec%s%s", console.format_logs(output), elapsed,
                     f" ({read / elapsed:.1f} steps/sec)" if rate else "",
                     f" | the eval data ended after {read} of {end.steps_asked} steps"
                     if ended else "", step=step)
        return output

    def flush_summaries(self) -> None:
        """Puts on disk what the summary managers kept (loops' results, evaluations' rates)."""
        self.summary_manager.flush()
        self.eval_summary_manager.flush_kept()

    def save_checkpoint(self) -> None:
        self._require("checkpoint_manager", "save_checkpoint")
        self._save(check_interval=False)

    def _save(self, check_interval: bool) -> bool:
        """Saves a checkpoint (if due, with `check_interval`); hooks see it once complete."""
        if self.checkpoint_manager is None:
            return False
        self._before_writing()
        self.flush_summaries()  # A checkpoint's steps have their summaries on disk.
        path = self.checkpoint_manager.save(checkpoint_number=self.step,
                                            check_interval=check_interval,
                                            options=self._save_options)
        saved = path is not None
        if saved:
            console.info("ckpt", "saved checkpoint to %s", path, step=self.step)
        if saved and self.checkpoints.on_end:
            # Hooks read the checkpoint's files: with async saving, wait for them.
            self._wait_for_checkpoints()
            for action in self.checkpoints.on_end:
                action(path)
        return saved

    def _wait_for_checkpoints(self, uploaded: bool = True) -> None:
        """Waits for an asynchronous save to be written (a no-op for synchronous ones), and
        with `uploaded` for ctl's manager to upload it to an object store."""
        if isinstance(self.checkpoint_manager, CheckpointManager):
            self.checkpoint_manager.sync(uploaded=uploaded)
        elif self.checkpoint_manager is not None:
            self.checkpoint_manager.sync()

    def _require(self, attribute: str, method: str) -> None:
        if getattr(self, attribute) is None:
            argument = _ARGUMENTS.get(attribute, f"`{attribute}`")
            raise ValueError(f"`{attribute}` is not set; pass {argument} to Controller() before "
                             f"calling {method}().")


_ARGUMENTS = {"checkpoint_manager": "`checkpoints=Checkpoints(manager=...)`"}


def next_evaluation(step: int, interval: Optional[int], train_steps: int) -> int:
    """The step of the first evaluation after `step`: the next multiple of `interval`
    (None: none), or `train_steps` if that comes first.

    Args:
        step: the current global step.
        interval: the eval interval (None: no evaluation before `train_steps`).
        train_steps: the step training ends at.
    """
    if interval is None:
        return train_steps
    return min(train_steps, (step // interval + 1) * interval)


def to_numpy(logs):
    """`logs` with every tensor as a NumPy value (cheaper here than `tf.nest.map_structure`).

    Args:
        logs: a dict of results, possibly nested, of tensors or values.
    """
    if isinstance(logs, dict):
        return {name: to_numpy(value) for name, value in logs.items()}
    return logs.numpy() if tf.is_tensor(logs) else logs

