"""Evaluation that does not depend on the cluster shape, and the reducer interface."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from ctl.cluster import reducers
from ctl.core.trainer import Trainer
from tests.cluster_tasks import ScoredTask
from tests.support.strategies import mirrored
from tests.tasks import regression_data

WEIGHTS = [np.array([[0.3], [-0.4], [1.5]], np.float32), np.array([0.1], np.float32)]


def evaluate(strategy, eval_examples, batch_size):
    trainer = Trainer(ScoredTask(eval_examples=eval_examples, batch_size=batch_size),
                      strategy=strategy)
    trainer.model.set_weights(WEIGHTS)
    return {name: float(value) for name, value in trainer.evaluate(tf.constant(-1)).items()}


def reference(eval_examples):
    """The same results computed with NumPy over the whole eval set at once."""
    features, targets = regression_data(eval_examples, seed=1)
    scores = (features @ WEIGHTS[0] + WEIGHTS[1])[:, 0]
    labels = targets[:, 0] > 0
    pairs = [(p, n) for p, n in itertools.product(scores[labels], scores[~labels])]
    auc = np.mean([1.0 if p > n else 0.5 if p == n else 0.0 for p, n in pairs])
    return {"examples": eval_examples, "aggregated_examples": eval_examples, "auc": auc,
            "loss": float(np.mean((targets[:, 0] - scores) ** 2)),
            "score_sum": float(scores.astype(np.float64).sum())}


# (eval examples, global batch): 9 in 8 leaves one replica of two an empty last batch;
# 10 in 4 leaves a last batch of 2 (one example per replica).
@pytest.mark.parametrize("eval_examples,batch_size", [(9, 8), (10, 4)])
def test_eval_results_are_the_same_for_one_and_two_replicas(eval_examples, batch_size):
    one = evaluate(tf.distribute.get_strategy(), eval_examples, batch_size)
    two = evaluate(mirrored(), eval_examples, batch_size)
    expected = reference(eval_examples)
    assert set(one) == set(two) == set(expected)
    for name in ("examples", "aggregated_examples", "auc"):
        assert one[name] == two[name] == expected[name], name
    for name in ("loss", "score_sum"):  # Summed in a different order: float rounding only.
        assert one[name] == pytest.approx(expected[name], rel=1e-6), name
        assert two[name] == pytest.approx(expected[name], rel=1e-6), name


class _UnlabelledEvalTask(ScoredTask):
    """Its validation_step reports no loss (an eval set without labels, as SQuAD's in Model Garden)."""

    def validation_step(self, inputs, model, metrics):
        logs = super().validation_step(inputs, model, metrics)
        del logs["loss"]
        return logs


@pytest.mark.parametrize("replicas", [1, 2])
def test_an_eval_step_without_a_loss_has_no_loss_result(replicas):
    trainer = Trainer(_UnlabelledEvalTask(eval_examples=10, batch_size=4),
                      strategy=mirrored() if replicas == 2 else tf.distribute.get_strategy())
    trainer.model.set_weights(WEIGHTS)
    results = {name: float(value) for name, value in trainer.evaluate(tf.constant(-1)).items()}
    expected = reference(10)
    assert "loss" not in results and "loss" in expected
    assert results["aggregated_examples"] == expected["aggregated_examples"]
    assert results["auc"] == expected["auc"]


def test_auc_reducer_matches_pairwise_definition_with_ties():
    rng = np.random.default_rng(3)
    scores = rng.integers(0, 5, size=40).astype(np.float32)  # Many ties.
    labels = rng.integers(0, 2, size=40)
    auc = reducers.AUC()
    # Three replicas, uneven batches, one replica that saw nothing.
    state = auc.start()
    for begin in range(0, 40, 7):
        batch = slice(begin, min(begin + 7, 40))
        split = (batch.start + batch.stop) // 2
        state = auc.update(state, {
            "scores": [scores[batch.start:split], scores[split:batch.stop], scores[:0]],
            "labels": [labels[batch.start:split], labels[split:batch.stop], labels[:0]],
        })
    pos, neg = scores[labels == 1], scores[labels == 0]
    expected = np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg])
    assert auc.results(state, global_step=0)["auc"] == pytest.approx(expected, abs=1e-12)


def test_auc_of_one_class_is_nan():
    auc = reducers.AUC()
    state = auc.update(auc.start(), {"scores": [np.ones(3)], "labels": [np.ones(3)]})
    assert np.isnan(auc.results(state, global_step=0)["auc"])
