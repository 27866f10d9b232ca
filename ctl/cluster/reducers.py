"""Reducers that ship with ctl: eval results over the whole eval set that Keras metrics cannot hold.

The protocol (`Reducer`: accumulate per replica, combine across replicas and
workers, result) and how the Trainer drives it are `ctl.core.aggregation`.
"""

import numpy as np

from ctl.core.aggregation import Reducer


class AUC(Reducer):
    """Exact area under the ROC curve over the whole eval set.

    Reads `logs[scores]` (higher means positive) and `logs[labels]` (0 or 1),
    one entry per example. Ties count one half (the Mann-Whitney statistic).
    Keras' `AUC` metric approximates with fixed thresholds; this one does not.

    Args:
        name: the result's name in the evaluation's results.
        scores: the `validation_step` entry holding each example's score.
        labels: the entry holding each example's label (0 or 1).
    """

    def __init__(self, name: str = "auc", scores: str = "scores", labels: str = "labels"):
        self.name = name
        self._scores = scores
        self._labels = labels

    def initial_state(self):
        return []

    def accumulate(self, state, logs):
        """Keeps one replica's scores and labels.

        Args:
            state: the replica's state (a list of `(scores, labels)`).
            logs: the replica's batch of `validation_step` entries.
        """
        scores = np.asarray(logs[self._scores], np.float64).reshape(-1)
        labels = np.asarray(logs[self._labels]).reshape(-1)
        return state + [(scores, labels)]

    def combine(self, states):
        """Concatenates every replica's scores and labels.

        Args:
            states: one state per replica.
        """
        pairs = [pair for state in states for pair in state]
        if not pairs:
            return np.zeros(0), np.zeros(0)
        return (np.concatenate([s for s, _ in pairs]), np.concatenate([y for _, y in pairs]))

    def result(self, state):
        """The exact AUC (NaN without both classes).

        Args:
            state: the combined `(scores, labels)`.
        """
        scores, labels = state
        positive = labels > 0.5
        count_pos, count_neg = int(positive.sum()), int((~positive).sum())
        if count_pos == 0 or count_neg == 0:
            return {self.name: float("nan")}
        ranks = _average_ranks(scores)
        rank_sum = ranks[positive].sum()
        auc = (rank_sum - count_pos * (count_pos + 1) / 2) / (count_pos * count_neg)
        return {self.name: float(auc)}


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing the mean of their ranks (vectorized: one sort)."""
    _, group, counts = np.unique(values, return_inverse=True, return_counts=True)
    last = np.cumsum(counts)  # The rank of each distinct value's last occurrence.
    return ((last - counts + 1 + last) / 2.0)[group.reshape(-1)]
