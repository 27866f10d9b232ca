"""ctl's batched loop summaries write what orbit's SummaryManager writes."""

import glob
import os

import numpy as np
import orbit
import pytest
import tensorflow as tf

import ctl
from ctl import train_lib
from ctl.core.controller import Controller, Summaries
from ctl.core.summaries import SummaryManager
from ctl.model_dir import ModelDir
from ctl.cluster.run_plan import RunPlan
from tests.tasks import PredictionsTask, RegressionTask


def _events(directory):
    """(tag, step, value, plugin, dtype) for every summary value under `directory`."""
    found = []
    for path in sorted(glob.glob(os.path.join(directory, "**", "events.out.tfevents.*"),
                                 recursive=True)):
        sub = os.path.relpath(os.path.dirname(path), directory)
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "text":  # The operative config.
                    continue
                found.append((sub, value.tag, event.step, float(tf.make_ndarray(value.tensor)),
                              value.metadata.plugin_data.plugin_name, value.tensor.dtype))
    return sorted(found)


def _steps_in_file_order(directory):
    """The steps of the "loss" values of the top directory's event files, in file order."""
    return [event.step for path in sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*")))
            for event in tf.compat.v1.train.summary_iterator(path)
            for value in event.summary.value if value.tag == "loss"]


LOGS = [
    {"loss": np.float32(0.25), "accuracy": np.float64(0.5), "examples": 7, "ok": True,
     "steps_per_second": 1234.5},
    {"loss": np.float32(0.125), "accuracy": np.float64(0.75), "examples": 9, "ok": False,
     "steps_per_second": 99.0},
    {"by_set": {"a": np.float32(1.0)}, "loss": 3.0},  # Nested: orbit's path.
]


@pytest.mark.parametrize("rounds", [1, 8])
def test_writes_the_same_summaries_as_orbit(tmp_path, rounds):
    """rounds=1: a flush after each loop; more: one flush of them all (one tf.function call
    for each directory's rows)."""
    step = tf.Variable(0, dtype=tf.int64)
    ours = SummaryManager(str(tmp_path / "ctl"), step)
    theirs = orbit.utils.SummaryManager(str(tmp_path / "orbit"), tf.summary.scalar,
                                        global_step=step)
    for logs in LOGS * rounds:
        step.assign_add(10)
        for manager in (ours, theirs):
            manager.write_summaries(logs)
            if rounds == 1:
                manager.flush()
    ours.flush()
    theirs.flush()
    written = _events(str(tmp_path / "ctl"))
    assert written == _events(str(tmp_path / "orbit"))
    assert ("by_set", "a", 30, 1.0, "scalars", tf.float32.as_datatype_enum) in written
    assert len(written) == (5 + 5 + 2) * rounds
    # In the order of the steps, within each directory, on disk too.
    assert _steps_in_file_order(str(tmp_path / "ctl")) == sorted(
        _steps_in_file_order(str(tmp_path / "ctl")))


def test_keeps_summaries_until_a_flush_is_due_the_first_ones_at_once(tmp_path):
    # The first rows (a run's first loop) go to disk at once, as under orbit; then every
    # FLUSH_SECONDS.
    now = [0.0]
    step = tf.Variable(5, dtype=tf.int64)
    manager = SummaryManager(str(tmp_path), step, clock=lambda: now[0])
    manager.flush_if_due()
    assert _events(str(tmp_path)) == []  # Nothing kept: nothing written.
    manager.write_summaries({"loss": 1.0})
    manager.flush_if_due()
    assert [e[1:4] for e in _events(str(tmp_path))] == [("loss", 5, 1.0)]
    manager.write_summaries({"loss": 2.0}, step=6)
    manager.write_summaries({"loss": 3.0}, step=7)
    now[0] += SummaryManager.FLUSH_SECONDS / 2
    manager.flush_if_due()
    assert len(_events(str(tmp_path))) == 1  # Kept, not yet on disk.
    now[0] += SummaryManager.FLUSH_SECONDS
    manager.flush_if_due()
    assert [e[1:4] for e in _events(str(tmp_path))] == [("loss", 5, 1.0), ("loss", 6, 2.0),
                                                        ("loss", 7, 3.0)]
    SummaryManager(None, step).write_summaries({"loss": 1.0})  # No dir: writes nothing.


def test_a_discard_removes_this_process_s_event_files_not_another_s(tmp_path):
    # A run refused before its first write removes what its writers made; an event file another
    # process made meanwhile in the same directory (a sidecar evaluator's, the trainer's that
    # holds the model dir) stays, and so does the directory that holds it.
    directory = tmp_path / "run" / "eval"
    manager = SummaryManager(str(directory), tf.Variable(1, dtype=tf.int64))
    manager.write_summaries({"loss": 1.0})
    manager.flush()
    other = directory / "events.out.tfevents.1.elsewhere.4242.0.v2"
    other.write_bytes(b"another process's")
    manager.discard()
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "run", "run/eval", f"run/eval/{other.name}"]


def test_a_nested_dict_is_written_after_what_was_kept(tmp_path):
    step = tf.Variable(1, dtype=tf.int64)
    manager = SummaryManager(str(tmp_path), step)
    manager.write_summaries({"loss": 1.0})
    step.assign(2)
    manager.write_summaries({"by_set": {"a": 3.0}})  # orbit's path: flushes first.
    manager.flush()
    assert [e[:4] for e in _events(str(tmp_path))] == [(".", "loss", 1, 1.0),
                                                         ("by_set", "a", 2, 3.0)]


def test_writing_makes_the_writer_the_default_and_writes_what_was_kept(tmp_path):
    manager = SummaryManager(str(tmp_path), tf.Variable(0, dtype=tf.int64))
    manager.write_summaries({"loss": 1.0}, step=1)  # Kept from before the block.
    with manager.writing():
        tf.summary.scalar("in_block", 2.0, step=2)  # To the summary dir's writer.
        manager.write_summaries({"loss": 3.0, "by_set": {"a": 4.0}}, step=2)
    assert [e[:4] for e in _events(str(tmp_path))] == [
        (".", "in_block", 2, 2.0), (".", "loss", 1, 1.0), (".", "loss", 2, 3.0),
        ("by_set", "a", 2, 4.0)]
    with pytest.raises(RuntimeError), manager.writing():
        manager.write_summaries({"loss": 5.0}, step=3)
        raise RuntimeError("what was kept before the error is still written")
    assert (".", "loss", 3, 5.0) in [e[:4] for e in _events(str(tmp_path))]


def test_rejects_a_non_scalar_like_orbit(tmp_path):
    manager = SummaryManager(str(tmp_path), tf.Variable(0, dtype=tf.int64))
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
        manager.write_summaries({"loss": np.zeros(3, np.float32)})


class _SummarizingTask(RegressionTask):
    """Writes a summary from inside the train step (orbit's in-graph summaries)."""

    def train_step(self, inputs, model, optimizer, metrics=None):
        logs = super().train_step(inputs, model, optimizer, metrics)
        tf.summary.scalar("in_step_loss", logs["loss"], step=optimizer.iterations)
        return logs


class _SummariesAtCheckpoint(ctl.hooks.Hook):
    """Records, at each checkpoint, the steps whose loop summaries are on disk."""

    def __init__(self, train_dir):
        self.train_dir = train_dir
        self.seen = {}

    def on_checkpoint_end(self, path):
        steps = {step for _, tag, step, *_ in _events(self.train_dir) if tag == "loss"}
        self.seen[self.run.step] = steps


def test_loop_summaries_are_on_disk_before_each_checkpoint(tmp_path):
    hook = _SummariesAtCheckpoint(str(tmp_path / "train"))
    experiment = ctl.Experiment(task=RegressionTask(), hooks=[hook], schedule=ctl.Schedule(
        train_steps=40, steps_per_loop=5, checkpoint_interval=10, eval_interval=None))
    ctl.run_experiment("train", str(tmp_path), experiment=experiment)
    assert sorted(hook.seen) == [10, 20, 30, 40]
    for step, steps in hook.seen.items():
        assert set(range(5, step + 1, 5)) <= steps


def test_summaries_inside_the_train_step_follow_summary_interval(tmp_path):
    experiment = ctl.Experiment(task=_SummarizingTask(), schedule=ctl.Schedule(
        train_steps=20, steps_per_loop=5, summary_interval=10, eval_interval=None))
    ctl.run_experiment("train", str(tmp_path), experiment=experiment)
    written = _events(str(tmp_path / "train"))
    # Recorded in the steps that start at a global step that is a multiple of 10
    # (0 and 10), at the optimizer's count in them: the update is applied after the
    # task's step returns (docs/train_step.md).
    assert sorted(step for _, tag, step, *_ in written if tag == "in_step_loss") == [0, 10]
    assert sorted(step for _, tag, step, *_ in written if tag == "loss") == [5, 10, 15, 20]


class _SummarizingEvalTask(RegressionTask):
    """Writes a summary from inside the eval step."""

    def validation_step(self, inputs, model, metrics):
        logs = super().validation_step(inputs, model, metrics)
        tf.summary.scalar("in_eval_step", logs["loss"], step=7)
        return logs


def test_an_evaluation_has_its_summaries_on_disk_when_it_returns(tmp_path, monkeypatch):
    """The results and the eval step's own summaries, written by one call after the loop and one
    eager flush of the writer (its context's end); the rate, kept, at the next flush (the next
    evaluation's, or the controller's: one call, no eager flush)."""
    experiment = ctl.Experiment(task=_SummarizingEvalTask(), schedule=ctl.Schedule(
        train_steps=10, eval_steps=2))
    built = train_lib.build_controller(RunPlan("eval"), ModelDir(str(tmp_path)), tf.distribute.get_strategy(),
                                       experiment)
    writer = built.controller.eval_summary_manager.summary_writer()
    eager_flushes = []

    def flush(flush=writer.flush):
        eager_flushes.extend([True] if tf.executing_eagerly() else [])
        return flush()

    monkeypatch.setattr(writer, "flush", flush)
    for evaluations in (1, 2):
        output = built.controller.evaluate(steps=2)
        assert len(eager_flushes) == evaluations
        written = [(tag, step, value) for _, tag, step, value, *_ in _events(str(tmp_path / "eval"))]
        assert [value for tag, step, value in written if (tag, step) == ("loss", 0)] == (
            pytest.approx([output["loss"]] * evaluations))
        assert [tag for tag, step, _ in written].count("in_eval_step") == 2 * evaluations  # A step each.
        # This evaluation's rate is kept; the one before went out with this one's flush.
        assert [tag for tag, *_ in written].count("steps_per_second") == evaluations - 1
    built.controller.flush_summaries()
    assert len(eager_flushes) == 2  # The kept rates: written and flushed by one function call.
    written = [tag for _, tag, step, *_ in _events(str(tmp_path / "eval")) if step == 0]
    assert written.count("steps_per_second") == 2



class _HostValueTrainer(ctl.Trainer):
    """Adds a value of its own to the eval loop's results (on the host, in `eval_end`)."""

    def eval_end(self, aggregated_logs=None):
        return {**super().eval_end(aggregated_logs), "host_value": 2.5}


@pytest.mark.parametrize("task, trainer_cls", [
    (PredictionsTask, ctl.Trainer),  # Aggregates on the host: the host loop.
    (RegressionTask, _HostValueTrainer),  # The one-call loop, and a value eval_end adds.
], ids=["aggregating_task", "eval_end_adds_a_value"])
def test_every_result_of_an_evaluation_is_on_disk_when_evaluate_returns(
        tmp_path, task, trainer_cls):
    experiment = ctl.Experiment(task=task(), trainer_cls=trainer_cls,
                                schedule=ctl.Schedule(train_steps=10, eval_steps=2))
    built = train_lib.build_controller(RunPlan("eval"), ModelDir(str(tmp_path)), tf.distribute.get_strategy(),
                                       experiment)
    output = built.controller.evaluate(steps=2)
    written = {tag: value for _, tag, step, value, *_ in _events(str(tmp_path / "eval"))
               if step == 0}
    assert set(output) - {"steps_per_second"} == set(written) > {"loss", "examples"}
    for tag, value in written.items():
        assert value == pytest.approx(float(output[tag]))


class _FailingEvalHook(ctl.hooks.Hook):
    def on_eval_end(self, logs):
        raise RuntimeError("the hook failed")


def test_an_evaluation_s_rate_is_on_disk_when_the_run_fails_after_it(tmp_path):
    experiment = ctl.Experiment(task=RegressionTask(), hooks=[_FailingEvalHook()],
                                schedule=ctl.Schedule(train_steps=10, eval_steps=2))
    with pytest.raises(RuntimeError, match="the hook failed"):
        ctl.run_experiment("train_and_eval", str(tmp_path), experiment=experiment)
    assert "steps_per_second" in [tag for _, tag, *_ in _events(str(tmp_path / "eval"))]


class _OrbitEvaluator(orbit.StandardEvaluator):
    """Another `orbit.AbstractEvaluator` than ctl's Trainer: sums its eval set."""

    def __init__(self):
        self.total = tf.Variable(0.0)
        super().__init__(eval_dataset=tf.data.Dataset.range(10).map(
            lambda x: tf.cast(x, tf.float32)).batch(2))

    def eval_begin(self):
        self.total.assign(0.0)

    def eval_step(self, iterator):
        self.total.assign_add(tf.reduce_sum(next(iterator)))

    def eval_end(self):
        return {"total": self.total}


def test_another_orbit_evaluator_has_its_results_on_disk_when_evaluate_returns(tmp_path):
    global_step = tf.Variable(3, dtype=tf.int64)
    controller = Controller(global_step=global_step, evaluator=_OrbitEvaluator(),
                            summaries=Summaries(eval=SummaryManager(str(tmp_path), global_step)))
    assert controller.evaluate(steps=5)["total"] == 45.0
    assert [(tag, step, value) for _, tag, step, value, *_ in _events(str(tmp_path))] == [
        ("total", 3, 45.0)]
    controller.flush_summaries()
    assert [tag for _, tag, *_ in _events(str(tmp_path))] == ["steps_per_second", "total"]
