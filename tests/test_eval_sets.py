"""Named eval sets (`Task.eval_datasets`) in-line: the same results, summaries and best-tracking as the sidecar."""

import dataclasses
import os

import numpy as np
import pytest
import tensorflow as tf

import ctl
from ctl.hooks.best import best_record
from ctl.sidecar import continuous_eval
from tests.support.reading import scalars
from ctl.model_dir import ModelDir
from tests.sidecar_tasks import TwoEvalSetsTask
from tests.tasks import RegressionTask, regression_data


def experiment(**kwargs):
    return ctl.Experiment(
        task=TwoEvalSetsTask(),
        schedule=ctl.Schedule(train_steps=20, steps_per_loop=5, eval_interval=10,
                              checkpoint_interval=10),
        **kwargs)


def test_named_eval_sets_in_line(tmp_path, strategy):
    model_dir = str(tmp_path)
    results = ctl.run_experiment("train_and_eval", model_dir, strategy, experiment(
        hooks=[ctl.hooks.BestCheckpoint(metric="far/loss")]))
    assert set(results) >= {"near", "far"}
    assert results["near"]["examples"] == 6 and results["far"]["examples"] == 10
    # Each set's summaries in its own directory, as the sidecar writes them.
    for name in ("near", "far"):
        assert set(scalars(os.path.join(model_dir, "eval", name))["loss"]) == {10, 20}
    evals = ModelDir(model_dir).metrics("eval")
    assert [r["step"] for r in evals] == [10, 20]
    far = {r["step"]: r["far/loss"] for r in evals}
    assert evals[-1]["near/examples"] == 6.0
    best = best_record(ModelDir(model_dir))
    assert best["metric"] == "far/loss" and best["step"] == min(far, key=far.get)

    # `--mode=eval` and the sidecar evaluate the same sets of the same checkpoints alike.
    again = ctl.run_experiment("eval", model_dir, strategy, experiment())
    np.testing.assert_allclose(again["far"]["loss"], results["far"]["loss"], rtol=1e-6)
    continuous_eval.evaluate_continuously(
        ModelDir(model_dir), strategy, experiment=dataclasses.replace(experiment(), hooks=()))
    sidecar = {r["step"]: r["results"] for r in
               ModelDir(model_dir).sidecar_evaluations()}
    assert sorted(sidecar) == [10, 20]
    for record in evals:
        for name in ("near", "far"):
            np.testing.assert_allclose(sidecar[record["step"]][name]["loss"],
                                       record[f"{name}/loss"], rtol=1e-5)


def test_eval_steps_past_the_end_of_a_set_end_at_its_end_in_line_and_on_the_sidecar(
        tmp_path, strategy, caplog):
    # ctl.Schedule.eval_steps (Model Garden's trainer.validation_steps) of 3: 'near' has 2
    # batches, 'far' 3. Each set ends at its end, as Model Garden's trainer ends it, with its
    # results over the whole set, in-line and on the sidecar; the console says what was read.
    def three_steps():
        return ctl.Experiment(task=TwoEvalSetsTask(), schedule=ctl.Schedule(
            train_steps=20, steps_per_loop=5, eval_interval=10, checkpoint_interval=10,
            eval_steps=3))

    model_dir = str(tmp_path)
    with caplog.at_level("INFO", logger="ctl"):
        results = ctl.run_experiment("train_and_eval", model_dir, strategy, three_steps())
    assert results["near"]["examples"] == 6 and results["far"]["examples"] == 10
    # 'near' is batches of 4 and 2, 'far' of 4, 4 and 2: 2 + 3 steps on one device; 1 + 2 on two
    # replicas, each step reading a batch on each (the task batches per replica).
    read = 5 if strategy.num_replicas_in_sync == 1 else 3
    said = [record.getMessage() for record in caplog.records]
    ended = [line for line in said if f"the eval data ended after {read} of 6 steps" in line]
    assert len(ended) == 2, said  # The evaluations at steps 10 and 20.
    assert [r["near/examples"] for r in ModelDir(model_dir).metrics("eval")] == [6.0, 6.0]
    continuous_eval.evaluate_continuously(ModelDir(model_dir), strategy, experiment=three_steps())
    sidecar = {r["step"]: r["results"] for r in ModelDir(model_dir).sidecar_evaluations()}
    assert sorted(sidecar) == [10, 20]
    for record in sidecar.values():
        assert (record["near"]["examples"], record["far"]["examples"]) == (6, 10)
    for name in ("near", "far"):  # The final checkpoint's, as the last in-line evaluation.
        np.testing.assert_allclose(sidecar[20][name]["loss"], results[name]["loss"], rtol=1e-5)


def test_a_hook_naming_an_unnamed_metric_lists_the_sets(tmp_path):
    with pytest.raises(ctl.UserError, match=r"'loss' is not among the evaluation results "
                       r"\(far/examples, far/loss, near/examples, near/loss"):
        ctl.run_experiment("train_and_eval", str(tmp_path), experiment=experiment(
            hooks=[ctl.hooks.BestCheckpoint(metric="loss")]))


class ChangingEvalSetsTask(TwoEvalSetsTask):
    """Its eval sets change after the first evaluation built them: `drop` a set, or
    `shift` the targets of one."""

    def __init__(self, drop=None, shift=None):
        super().__init__()
        self.drop, self.shift, self.builds = drop, shift, 0

    def eval_datasets(self):
        self.builds += 1
        return tuple(n for n in self.SIZES if self.builds == 1 or n != self.drop)

    def build_inputs(self, training, input_context=None, name="near"):
        dataset = super().build_inputs(training, input_context, name)
        if training or self.builds == 1 or name != self.shift:
            return dataset
        return dataset.map(lambda features, targets: (features, targets + 1.0))


def test_smoke_mode_compares_every_named_set(caplog):
    from ctl import smoke

    def changing(**kwargs):
        return dataclasses.replace(experiment(), task=ChangingEvalSetsTask(**kwargs))

    with caplog.at_level("INFO", logger="ctl"):
        assert smoke.run_smoke(experiment=changing()) > 0
    # No line points at the temporary dir, deleted when it passes, as a place to look.
    said = [record.getMessage() for record in caplog.records]
    assert any(line.startswith("PASS") for line in said)
    assert not [line for line in said if "to look" in line or "ctl.report" in line], said
    with pytest.raises(ctl.UserError, match=r"failed at restore: .*lack far/examples, far/loss"):
        smoke.run_smoke(experiment=changing(drop="far"))
    for name in ("near", "far"):
        with pytest.raises(ctl.UserError, match=rf"failed at restore: .*{name}/loss"):
            smoke.run_smoke(experiment=changing(shift=name))


class StaticBatchEvalTask(RegressionTask):
    """Its eval set batched with drop_remainder: every batch has the static size 8."""

    def build_inputs(self, training, input_context=None):
        if training:
            return super().build_inputs(training, input_context)
        features, targets = regression_data(self.eval_examples, seed=1)
        return tf.data.Dataset.from_tensor_slices((features, targets)).batch(8, drop_remainder=True)


def test_the_eval_loss_of_a_static_batch_size_is_the_mean_over_the_eval_set(tmp_path):
    # The step after the last batch finds the set ended; with a static batch size the
    # example count is a constant, and was once added for that step too (a loss half the
    # true one over one batch).
    task = StaticBatchEvalTask(learning_rate=0.0, eval_examples=16)  # Weights stay zero.
    results = ctl.run_experiment("train_and_eval", str(tmp_path), experiment=ctl.Experiment(
        task=task, schedule=ctl.Schedule(train_steps=2, steps_per_loop=1, eval_interval=2)))
    _, targets = regression_data(16, seed=1)
    assert results["examples"] == 16
    assert results["loss"] == pytest.approx(float(np.mean(np.square(targets))), rel=1e-6)
