"""A regression task whose evaluation also needs the whole eval set: exact AUC and counts."""

import gin
import numpy as np
import tensorflow as tf

from ctl.cluster import reducers
from tests.tasks import RegressionTask


@gin.configurable
class ScoredTask(RegressionTask):
    """RegressionTask that also scores "is the target positive?" on the eval set.

    Its eval logs hold, through aggregate_logs, the exact AUC of the predictions (a
    reducer folded into its state) and how many examples each evaluation saw.
    """

    auc = reducers.AUC("auc", scores="scores", labels="labels")

    def validation_step(self, inputs, model, metrics):
        logs = super().validation_step(inputs, model, metrics)
        features, targets = inputs
        logs["scores"] = model(features, training=False)[:, 0]
        logs["labels"] = tf.cast(targets[:, 0] > 0, tf.int32)
        logs["batch_size"] = tf.shape(features)[0]  # A scalar per replica.
        return logs

    def aggregate_logs(self, state, step_logs):
        state = state or {"examples": 0, "score_sum": 0.0, "auc": None}
        state["examples"] += int(sum(step_logs["batch_size"]))
        state["score_sum"] += float(sum(np.sum(s, dtype=np.float64) for s in step_logs["scores"]))
        state["auc"] = self.auc.update(state["auc"], step_logs)
        return state

    def reduce_aggregated_logs(self, aggregated_logs, global_step):
        return {"aggregated_examples": aggregated_logs["examples"],
                "score_sum": aggregated_logs["score_sum"],
                **self.auc.results(aggregated_logs["auc"], global_step)}

