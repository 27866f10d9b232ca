"""Before its first step a run traces its train step as often as its train loop does, no more.

ctl checks the task before anything is written (ctl.core.contract.check_run):
that check is the train loop's own trace, which the first loop then runs. A
model that makes variables on its first call (Model Garden's RetinaNet head)
makes TensorFlow trace a function twice; a run of it traces the task's
`train_step` exactly as often as a bare `tf.function` of that step does (so as
often as Model Garden's trainer), where a check with a trace of its own made it
three times. Counted by the task itself: its Python `train_step` runs only as
it is traced. On the default and the mirrored strategy.
"""

import logging
import os
import threading
import time

import pytest
import tensorflow as tf
import tf_keras

import ctl
from ctl.model_dir import ModelDir
from ctl.model_dir.trainer_lock import TRAINER_LOCK_FILE, ModelDirLock
from tests import contract_tasks
from tests.sidecar_tasks import RandomDraw
from tests.tasks import RegressionTask


class _Counted(RegressionTask):
    """A tf_keras regression task that counts how often its steps are traced."""

    def __init__(self):
        super().__init__(flavor="tf_keras")
        self.train_traces = 0
        self.eval_traces = 0

    def train_step(self, inputs, model, optimizer, metrics):
        self.train_traces += 1
        return super().train_step(inputs, model, optimizer, metrics)

    def validation_step(self, inputs, model, metrics):
        self.eval_traces += 1
        return super().validation_step(inputs, model, metrics)


class _LateHead(tf_keras.Model):
    """A body built with the model, and a head that makes its variables on its first call."""

    def __init__(self):
        super().__init__()
        self.body = tf_keras.layers.Dense(4)
        self.body.build((None, 3))
        self.head = tf_keras.layers.Dense(1)  # Built inside the first trace.

    def call(self, inputs, training=False):
        return self.head(self.body(inputs))


class LateHeadTask(_Counted):
    def build_model(self):
        return _LateHead()

    def build_optimizer(self):
        # Makes its variables for the head's as it first applies them (a new-style optimizer
        # knows only the variables it was built with).
        return tf_keras.optimizers.legacy.SGD(self.learning_rate)


class PlainTask(_Counted):
    pass


def _bare_traces(task_type, strategy) -> int:
    """How often a bare `tf.function` of the task's step, under `strategy`, traces it on its
    first call (per trace, once per replica)."""
    task = task_type()
    with strategy.scope():
        model, optimizer = task.build_model(), task.build_optimizer()
    dataset = strategy.distribute_datasets_from_function(
        lambda context: task.build_inputs(True, context))

    @tf.function
    def step(iterator):
        strategy.run(lambda inputs: task.train_step(
            inputs, model=model, optimizer=optimizer, metrics=[])["loss"], args=(next(iterator),))

    step(iter(dataset))
    return task.train_traces


def _first_loop(task, strategy, model_dir: str, mode: str = "train", **schedule) -> dict:
    """One loop of two steps in `mode` (`schedule` overrides), its results."""
    schedule = ctl.Schedule(**{**dict(train_steps=2, steps_per_loop=2, eval_interval=None,
                                      checkpoint_interval=2), **schedule})
    return ctl.run_experiment(mode, model_dir, strategy, ctl.Experiment(task=task, schedule=schedule))


def test_a_model_that_builds_on_its_first_call_is_traced_as_often_as_by_a_bare_function(
        strategy, tmp_path):
    bare = _bare_traces(LateHeadTask, strategy)
    # TensorFlow traces a function again after a trace that made variables.
    assert bare == 2 * strategy.num_replicas_in_sync
    task = LateHeadTask()
    _first_loop(task, strategy, str(tmp_path))
    assert task.train_traces == bare


def test_a_model_built_whole_is_traced_once(strategy, tmp_path):
    task = PlainTask()
    _first_loop(task, strategy, str(tmp_path))
    assert task.train_traces == strategy.num_replicas_in_sync


class SummarizingTask(_Counted):
    """Writes a summary of its own from its train step."""

    def train_step(self, inputs, model, optimizer, metrics):
        logs = super().train_step(inputs, model, optimizer, metrics)
        tf.summary.scalar("own_loss", logs["loss"])
        return logs


def test_the_loop_under_a_summary_writer_is_traced_once_and_its_summaries_are_written(tmp_path):
    # The check traces the loop under the run's writer: the first loop runs that trace, and the
    # step's own tf.summary calls write (at each multiple of summary_interval).
    from tests.support.reading import scalars

    task = SummarizingTask()
    schedule = ctl.Schedule(train_steps=4, steps_per_loop=2, eval_interval=None,
                            checkpoint_interval=4, summary_interval=2)
    ctl.run_experiment("train", str(tmp_path), experiment=ctl.Experiment(task=task, schedule=schedule))
    assert task.train_traces == 1
    # At the global step the step starts from (orbit's too): 0 and 2.
    assert sorted(scalars(str(tmp_path / "train"))["own_loss"]) == [0, 2]


def _earlier_run(tmp_path, exists: bool):
    """`tmp_path/run`: absent, or an earlier run's dir (an event file, its config)."""
    model_dir = tmp_path / "run"
    if exists:
        (model_dir / "train").mkdir(parents=True)
        (model_dir / "train" / "events.out.tfevents.1.earlier.v2").write_bytes(b"")
        (model_dir / "config.gin").write_text("# an earlier run's\n")
    return model_dir


def _files(root) -> dict:
    """Every path under `root`, with a file's bytes."""
    return {str(p): p.read_bytes() if p.is_file() else None for p in root.rglob("*")}


@pytest.mark.parametrize("exists", [False, True], ids=["new_dir", "existing_dir"])
def test_a_bad_train_step_under_a_summary_writer_leaves_the_model_dir_as_it_was(tmp_path, exists):
    model_dir = _earlier_run(tmp_path, exists)
    before = _files(tmp_path)
    schedule = ctl.Schedule(train_steps=2, steps_per_loop=2, eval_interval=None,
                            checkpoint_interval=2, summary_interval=2)
    with pytest.raises(ctl.UserError, match="returned a loss of shape"):
        ctl.run_experiment("train", str(model_dir), experiment=ctl.Experiment(
            task=contract_tasks.VectorLossTask(), schedule=schedule))
    assert _files(tmp_path) == before


def test_a_bad_train_step_still_ends_before_the_model_dir_is_written(tmp_path):
    model_dir = str(tmp_path / "run")
    with pytest.raises(ctl.UserError, match="returned a loss of shape"):
        _first_loop(contract_tasks.VectorLossTask(), None, model_dir)
    assert not os.path.exists(model_dir)


# The eval step: its check is the evaluation's own trace, run beside the first train loop.


@pytest.mark.parametrize("eval_steps", [None, 2], ids=["host_loop", "one_call"])
def test_a_train_and_eval_run_traces_its_eval_step_once(strategy, tmp_path, eval_steps):
    # Whole eval sets run the host loop (a tf.function step per batch); a fixed number of
    # steps one tf.function call with the metrics' reset and read: the check traces each.
    task = PlainTask()
    _first_loop(task, strategy, str(tmp_path), "train_and_eval", eval_steps=eval_steps)
    assert task.eval_traces == strategy.num_replicas_in_sync
    assert task.train_traces == strategy.num_replicas_in_sync


class DrawingTask(PlainTask):
    """Its evaluation reports a draw of TensorFlow's stateful random ops (`RandomDraw`)."""

    def build_metrics(self, training=True):
        return super().build_metrics(training) + ([] if training else [RandomDraw()])


@pytest.mark.parametrize("task_type,eval_steps", [(PlainTask, None), (DrawingTask, None), (DrawingTask, 2)],
                         ids=["no_random_op", "random_op-host_loop", "random_op-one_call"])
def test_a_seeded_run_traces_its_eval_step_anew_for_each_evaluation_only_if_it_draws(
        tmp_path, task_type, eval_steps):
    # ctl.FaultTolerance.seed, two evaluations (steps 2 and 4): an eval step without stateful
    # random ops is traced once, beside the first loop; one that draws from them once for each
    # evaluation (`ctl.core.evaluation`), the first evaluation's trace still the one beside it.
    task = task_type()
    schedule = ctl.Schedule(train_steps=4, steps_per_loop=2, eval_interval=2, checkpoint_interval=2,
                            eval_steps=eval_steps)
    ctl.run_experiment("train_and_eval", str(tmp_path), experiment=ctl.Experiment(
        task=task, schedule=schedule, fault_tolerance=ctl.FaultTolerance(seed=1)))
    assert task.eval_traces == (2 if task_type is DrawingTask else 1)
    assert task.train_traces == 1


class SummarizingEvalTask(_Counted):
    """Writes a summary of its own from its eval step."""

    def validation_step(self, inputs, model, metrics):
        logs = super().validation_step(inputs, model, metrics)
        tf.summary.scalar("own_eval_loss", logs["loss"], step=7)
        return logs


def test_the_eval_steps_own_summaries_are_written_by_the_traced_evaluation(tmp_path):
    # Traced beside the first loop under the eval summaries' writer: the evaluation runs that
    # trace, and the eval step's tf.summary calls write to eval/.
    from tests.support.reading import scalars

    task = SummarizingEvalTask()
    _first_loop(task, None, str(tmp_path), "train_and_eval", eval_steps=2)
    assert task.eval_traces == 1
    assert sorted(scalars(str(tmp_path / "eval"))["own_eval_loss"]) == [7]


class _TrainLines(logging.Handler):
    """Sets `seen` at the first train line ctl logs."""

    def __init__(self):
        super().__init__()
        self.seen = threading.Event()

    def emit(self, record):
        if getattr(record, "ctl_kind", None) == "train":
            self.seen.set()


class EagerEvalTask(PlainTask):
    """Its train step waits (at most 3 s) for its eval step's trace to begin; the eval step's
    trace records whether the run's first train line came before it."""

    def __init__(self, lines: _TrainLines):
        super().__init__()
        self.lines = lines
        self.eval_began = threading.Event()
        self.line_before_check: list = []

    def train_step(self, inputs, model, optimizer, metrics):
        wait = tf.py_function(lambda: self.eval_began.wait(3), [], tf.bool)
        with tf.control_dependencies([wait]):
            return super().train_step(inputs, model, optimizer, metrics)

    def validation_step(self, inputs, model, metrics):
        if not self.line_before_check:
            self.line_before_check.append(self.lines.seen.is_set())
            self.eval_began.set()
        return super().validation_step(inputs, model, metrics)


def test_the_eval_steps_check_starts_when_the_first_loop_ended(tmp_path):
    # Not beside the first loop, whose CPU it would take on a busy host: the first loop's line
    # and summaries come before the eval step's trace begins (a check begun beside the loop is
    # seen by its step, which waits for it, and comes before that line); the run's first write
    # waits for the check.
    from tests.support.reading import scalars

    lines = _TrainLines()
    logger = logging.getLogger("ctl")
    logger.addHandler(lines)
    try:
        task = EagerEvalTask(lines)
        _first_loop(task, None, str(tmp_path), "train_and_eval", train_steps=4, eval_interval=4,
                    checkpoint_interval=4, summary_interval=2)
    finally:
        logger.removeHandler(lines)
    assert task.line_before_check == [True]
    assert task.eval_traces == 1
    assert sorted(scalars(str(tmp_path / "train"))["loss"]) == [2, 4]


class VectorEvalLossTask(RegressionTask):
    """Its validation_step returns the per-example loss; its train step is right."""

    def validation_step(self, inputs, model, metrics):
        features, labels = inputs
        return {"loss": tf.reduce_mean(tf.square(labels - model(features)), axis=-1)}


@pytest.mark.parametrize("exists", [False, True], ids=["new_dir", "existing_dir"])
def test_a_bad_eval_step_ends_the_run_before_its_first_write(tmp_path, exists):
    # Found beside the first train loop: the run stops at that loop's end, before its
    # checkpoint, having taken no lock and written nothing (the first loop's summaries go).
    model_dir = _earlier_run(tmp_path, exists)
    before = _files(tmp_path)
    with pytest.raises(ctl.UserError, match=r"VectorEvalLossTask.validation_step returned a loss "
                                            r"of shape \(\w+,\), not a scalar"):
        _first_loop(VectorEvalLossTask(), None, str(model_dir), "train_and_eval",
                    summary_interval=2)
    assert _files(tmp_path) == before


class NanBeforeTheEvalCheckTask(VectorEvalLossTask):
    """Its loss is NaN from its first step (or, `fails`, the step fails); its eval step's check
    refuses it, and that check's trace (beside the first train loop) ends only after the first
    step ran."""

    def __init__(self, fails: bool = False):
        super().__init__()
        self.fails = fails
        self.stepped = threading.Event()
        self.eval_traced = False

    def build_losses(self, labels, outputs, aux_losses=None):
        nan = tf.ensure_shape(tf.py_function(self._nan, [], tf.float32), [])
        return super().build_losses(labels, outputs) * nan

    def _nan(self):
        self.stepped.set()
        if self.fails:
            raise ValueError("the step's data ran dry")
        return tf.constant(float("nan"))

    def validation_step(self, inputs, model, metrics):
        self.eval_traced = True
        self.stepped.wait(30)
        time.sleep(1)  # The train loop meanwhile ends on its bad loss.
        return super().validation_step(inputs, model, metrics)


def test_a_bad_loss_in_the_first_loop_waits_for_the_eval_steps_check(tmp_path):
    # The NaN guard's stop, at the first loop's end, comes after the eval step's check beside
    # it: the check's error is the run's, and the run leaves the model dir as it found it.
    model_dir = _earlier_run(tmp_path, exists=False)
    before = _files(tmp_path)
    with pytest.raises(ctl.UserError, match=r"NanBeforeTheEvalCheckTask.validation_step returned "
                                            r"a loss of shape \(\w+,\), not a scalar"):
        _first_loop(NanBeforeTheEvalCheckTask(), None, str(model_dir), "train_and_eval")
    assert _files(tmp_path) == before


def test_a_first_loop_that_fails_before_the_eval_steps_check_leaves_the_model_dir(tmp_path):
    # The loop's error is the run's; the check, not begun (it starts when the first loop
    # ended), is not run: the run leaves nothing.
    model_dir = _earlier_run(tmp_path, exists=False)
    before = _files(tmp_path)
    task = NanBeforeTheEvalCheckTask(fails=True)
    with pytest.raises(tf.errors.OpError, match="the step's data ran dry"):
        _first_loop(task, None, str(model_dir), "train_and_eval")
    assert _files(tmp_path) == before
    assert not task.eval_traced


class TakenMeanwhileTask(PlainTask):
    """Its eval step's check (beside the first train loop, before the claim is taken) has
    another trainer take the model dir: one that started since this run found it free."""

    def __init__(self, model_dir: str):
        super().__init__()
        self.other = ModelDirLock(ModelDir(model_dir))

    def validation_step(self, inputs, model, metrics):
        if not self.eval_traces:
            self.other.acquire()
        return super().validation_step(inputs, model, metrics)


def test_a_model_dir_taken_during_the_first_loop_is_left_as_the_other_trainer_has_it(tmp_path):
    # The run's first loop wrote its summaries (and the eval step's check traced under the eval
    # writer) before its claim was refused: they go, the other trainer's dir is as it had it.
    model_dir = _earlier_run(tmp_path, exists=True)
    before = _files(tmp_path)
    task = TakenMeanwhileTask(str(model_dir))
    try:
        with pytest.raises(ctl.UserError, match=rf"is in use by another trainer \(pid {os.getpid()}"):
            _first_loop(task, None, str(model_dir), "train_and_eval", summary_interval=2)
        after = _files(tmp_path)
        assert after.pop(str(model_dir / TRAINER_LOCK_FILE))  # The other trainer's record.
        assert after == before
    finally:
        task.other.release()


def _objects(gs_dir: str) -> dict:
    """Every object under `gs_dir`, with its bytes."""
    found = {}
    for directory, _, names in tf.io.gfile.walk(gs_dir):
        for name in names:
            path = f"{directory.rstrip('/')}/{name}"
            with tf.io.gfile.GFile(path, "rb") as f:
                found[path] = f.read()
    return found


@pytest.mark.parametrize("exists", [False, True], ids=["new_dir", "existing_dir"])
@pytest.mark.parametrize("bad", ["train_step", "eval_step"])
def test_a_bad_step_on_gs_leaves_the_bucket_as_it_was(gcs_dir, exists, bad):
    # In an object store the trainer's lease settles while the steps are checked (the train
    # step's trace, then the eval step's): refused, the lease's record is put back as it was
    # (an earlier trainer's stale one), or deleted; no summary was uploaded.
    import json

    if exists:
        for name, data in {"train/events.out.tfevents.1.earlier.v2": b"",
                           "config.gin": b"# an earlier run's\n",
                           "trainer.lock": json.dumps({"role": "trainer", "host": "gone-host",
                                                       "pid": 7, "token": "earlier",
                                                       "renewed": 1.0}).encode()}.items():
            with tf.io.gfile.GFile(f"{gcs_dir}/{name}", "wb") as f:
                f.write(data)
    before = _objects(gcs_dir)
    task, step = ((contract_tasks.VectorLossTask(), "build_losses") if bad == "train_step" else
                  (VectorEvalLossTask(), "validation_step"))
    with pytest.raises(ctl.UserError, match=rf"{type(task).__name__}.{step} returned a loss "
                                            r"of shape \(\w+,\), not a scalar"):
        _first_loop(task, None, gcs_dir, "train_and_eval", summary_interval=2)
    assert _objects(gcs_dir) == before
