"""The train input's position on resume: read from the checkpoint where TensorFlow can save it, else skipped to.

In-process, real TensorFlow and model dirs. The process tests of
tests/test_preemption.py check that resumed runs end bit-identical.
"""

import numpy as np
import pytest
import tensorflow as tf

import ctl
from ctl import train_lib
from ctl.core.stop import SignalWatcher
from tests.support.reading import assert_bit_equal, checkpoint_values
from ctl.model_dir import ModelDir
from ctl.cluster.run_plan import RunPlan
from tests.fault_tasks import LateDropoutTask, ProbeTask


def _experiment(task, train_steps, **fault_tolerance):
    schedule = ctl.Schedule(train_steps=train_steps, steps_per_loop=5, checkpoint_interval=10,
                            eval_interval=None, max_checkpoints=10)
    return ctl.Experiment(task=task, schedule=schedule,
                          fault_tolerance=ctl.FaultTolerance(**fault_tolerance))


def _resumed(model_dir, task, strategy=None):
    """A trainer restored from `model_dir` with its input positioned, as ctl.run builds it."""
    strategy = strategy or tf.distribute.get_strategy()
    with SignalWatcher() as watcher:
        built = train_lib.build_controller(RunPlan("train"), ModelDir(str(model_dir)), strategy,
                                           _experiment(task, 10**9), watcher=watcher)
    how = built.faults.resume_inputs()
    return built, how


def _batches(task, start, count):
    """Batches `start`..`start + count - 1` (0-based) of a fresh train pipeline."""
    iterator = iter(task.build_inputs(True, tf.distribute.InputContext()))
    for _ in range(start):
        next(iterator)
    return [next(iterator) for _ in range(count)]


def _same(a, b):
    return all(np.array_equal(x.numpy(), y.numpy()) for x, y in zip(tf.nest.flatten(a),
                                                                     tf.nest.flatten(b)))


class CachedTask(ProbeTask):
    """ProbeTask with `cache()` (whose state holds what it cached so far)."""

    def build_inputs(self, training, input_context=None):
        dataset = super().build_inputs(training, input_context)
        return dataset.unbatch().cache().batch(self.batch_size) if training else dataset


class GeneratedTask(ProbeTask):
    """ProbeTask whose train data come from a Python generator: no savable iterator state."""

    def build_inputs(self, training, input_context=None):
        if not training:
            return super().build_inputs(training, input_context)
        rows = [(x, y) for x, y in super().build_inputs(True, input_context).unbatch().take(120)]

        def generate():
            while True:
                yield from ((x.numpy(), y.numpy()) for x, y in rows)

        spec = tuple(tf.TensorSpec(t.shape, t.dtype) for t in rows[0])
        return tf.data.Dataset.from_generator(generate, output_signature=spec).batch(
            self.batch_size, drop_remainder=True)


@pytest.mark.parametrize("task_cls", [ProbeTask, CachedTask], ids=["shuffle", "cache"])
def test_the_position_is_read_from_the_checkpoint_not_found_by_skipping(tmp_path, task_cls):
    ctl.run_experiment("train", str(tmp_path), experiment=_experiment(task_cls(), 20))
    assert any(name.startswith("train_input/") for name in checkpoint_values(
        tf.train.latest_checkpoint(str(tmp_path))))
    # The same position under a far later step: a skip would land elsewhere.
    built, how = _resumed(tmp_path, task_cls())
    assert how == "checkpoint"
    built.trainer.global_step.assign(1013)
    built.controller.save_checkpoint()

    built, how = _resumed(tmp_path, task_cls())
    assert how == "checkpoint"
    assert int(built.trainer.global_step.numpy()) == 1013
    resumed = [next(built.trainer.train_iterator) for _ in range(3)]
    expected = _batches(task_cls(), 20, 3)
    assert all(_same(a, b) for a, b in zip(resumed, expected))
    assert not _same(resumed[0], _batches(task_cls(), 1013, 1)[0])


def test_mirrored_skips_to_the_position(tmp_path):
    from tests.support.strategies import mirrored

    strategy = mirrored()
    ctl.run_experiment("train", str(tmp_path), strategy, _experiment(ProbeTask(), 20))
    built, how = _resumed(tmp_path, ProbeTask(), strategy)
    assert how == "skip"
    assert "cannot checkpoint" in built.faults.input_position.why_not_saved
    assert not any(n.startswith("train_input/") for n in checkpoint_values(
        tf.train.latest_checkpoint(str(tmp_path))))


def test_an_unsavable_pipeline_skips_and_a_checkpoint_without_position_still_recovers(tmp_path):
    ctl.run_experiment("train", str(tmp_path), experiment=_experiment(GeneratedTask(), 10))
    assert not any(n.startswith("train_input/") for n in checkpoint_values(
        tf.train.latest_checkpoint(str(tmp_path))))
    built, how = _resumed(tmp_path, GeneratedTask())
    assert how == "skip" and "GeneratorDataset" in built.faults.input_position.why_not_saved

    # Resumed by a pipeline that can be saved (as after an upgrade from a ctl that saved
    # no position): skips once, then saves positions; a NaN at step 12 restores ckpt-10,
    # which has none, and replays from there.
    ctl.run_experiment("train", str(tmp_path), experiment=_experiment(
        ProbeTask(nan_at_steps=(12,)), 30, nan_policy="recover"))
    final = checkpoint_values(tf.train.latest_checkpoint(str(tmp_path)))
    assert any(n.startswith("train_input/") for n in final)
    assert final["global_step/.ATTRIBUTES/VARIABLE_VALUE"] == 30
    # Positions saved after that skip fit a freshly built pipeline.
    assert _resumed(tmp_path, ProbeTask())[1] == "checkpoint"


def test_a_generator_made_in_the_first_trace_is_saved_and_restored(tmp_path):
    # A resumed run restores its checkpoint before it traces the step that makes the head's
    # generator: the generator still gets its saved state, so the resumed steps draw the masks
    # an uninterrupted run draws (a fresh generator would start its stream over).
    def run(model_dir, steps):
        schedule = ctl.Schedule(train_steps=steps, steps_per_loop=2, checkpoint_interval=2,
                                eval_interval=None)
        ctl.run_experiment("train", str(model_dir), experiment=ctl.Experiment(
            task=LateDropoutTask(), schedule=schedule))
        return tf.train.latest_checkpoint(str(model_dir))

    straight = run(tmp_path / "straight", 4)
    run(tmp_path / "resumed", 2)
    resumed = run(tmp_path / "resumed", 4)
    assert_bit_equal(straight, resumed)
    assert [n for n in checkpoint_values(straight) if n.startswith("rng/")]
