"""Host aggregation of eval outputs: the one API the Trainer drives, and `Reducer` on it.

A Keras metric keeps a fixed set of variables that replicas sum; an exact AUC,
a median or a per-example dump needs every output of the eval set. The Trainer
gathers the extra entries of the task's `validation_step` (everything but
"loss") from every replica of every worker, splits them back per replica on
the host, and hands each eval step to every `Aggregation` of the task:

    states = [aggregation.start() for each aggregation]
    for each eval step:                    # eager, NumPy values
      step_logs = {name: [one array per replica of every worker]}
      states = [aggregation.update(state, step_logs) ...]
    results = union of aggregation.results(state, global_step)

so each worker computes the same results, whatever the number of replicas or
workers. One route: a task's aggregations are `of_task(task)`, what
`Task.build_reducers()` returns (`Reducer`s, which see one replica's batch at a
time and combine per-replica states at the end, e.g. `ctl.cluster.reducers.AUC`;
or any `Aggregation`). `Task.aggregate_logs` / `reduce_aggregated_logs` (Model
Garden's names, kept so `ctl.ModelGardenTask` and ported tasks run unchanged)
are a thin alias: one more aggregation, `TaskAggregation`, first in the list.
"""

import abc
from typing import Any, Dict, List, Mapping, Sequence

import numpy as np

StepLogs = Mapping[str, Sequence[np.ndarray]]  # name -> one array per replica of every worker.


class Aggregation(abc.ABC):
    """Folds eval steps into a state on the host, then turns it into named results."""

    def start(self) -> Any:
        """The state before the first step of an evaluation."""
        return None

    @abc.abstractmethod
    def update(self, state: Any, step_logs: StepLogs) -> Any:
        """Folds one eval step (every replica's batch) into `state`; returns the new state.

        Args:
            state: the state so far (None before the first step of an evaluation).
            step_logs: each extra entry of `validation_step` mapped to a list with one NumPy array per replica, of
                every worker.
        """

    @abc.abstractmethod
    def results(self, state: Any, global_step: int) -> Dict[str, Any]:
        """Named results of the evaluation.

        Args:
            state: the state after the evaluation's last step.
            global_step: the global step the evaluation ran at.

        Returns:
            `{name: scalar}`, added to the evaluation's results.
        """


class Reducer(Aggregation):
    """Accumulates per replica batch, combines across replicas, then results.

        states = [reducer.initial_state() for each replica of every worker]
        for each eval step, for each replica r:
          states[r] = reducer.accumulate(states[r], logs of replica r's batch)
        return reducer.result(reducer.combine(states))
    """

    def initial_state(self) -> Any:
        """The state of a replica that has seen no batch."""
        return None

    @abc.abstractmethod
    def accumulate(self, state: Any, logs: Mapping[str, np.ndarray]) -> Any:
        """Folds one replica's batch into that replica's `state`; returns the new state.

        Args:
            state: the replica's state (`initial_state()` before its first batch).
            logs: the extra entries of `validation_step` for one replica's batch, as NumPy arrays.
        """

    @abc.abstractmethod
    def combine(self, states: Sequence[Any]) -> Any:
        """Combines the states of all replicas (of all workers) into one.

        Args:
            states: one state per replica, of every worker.
        """

    @abc.abstractmethod
    def result(self, state: Any) -> Dict[str, Any]:
        """Named results of the combined state.

        Args:
            state: the combined state (`combine`).

        Returns:
            `{name: scalar}`, added to the evaluation's results.
        """

    # As an Aggregation: the state is the list of per-replica states.

    def start(self) -> List[Any]:
        return []

    def update(self, state: List[Any], step_logs: StepLogs) -> List[Any]:
        """The `Aggregation` side of a reducer: `accumulate` for each replica's batch of the step.

        Args:
            state: one state per replica seen so far (a list, grown as replicas appear).
            step_logs: each extra entry of `validation_step` mapped to a list with one NumPy array per replica, of
                every worker.
        """
        replicas = len(next(iter(step_logs.values()))) if step_logs else 0
        while len(state) < replicas:
            state.append(self.initial_state())
        for r in range(replicas):
            state[r] = self.accumulate(state[r], {name: values[r] for name, values in step_logs.items()})
        return state

    def results(self, state: List[Any], global_step: int) -> Dict[str, Any]:
        """The `Aggregation` side of a reducer: `result(combine(states))`.

        Args:
            state: one state per replica.
            global_step: not read.
        """
        del global_step
        return self.result(self.combine(state or [self.initial_state()]))


class TaskAggregation(Aggregation):
    """A task's `aggregate_logs` and `reduce_aggregated_logs`, as an aggregation.

    Args:
        task: the `ctl.Task` whose `aggregate_logs` and `reduce_aggregated_logs` run.
    """

    def __init__(self, task):
        self.task = task

    def update(self, state: Any, step_logs: StepLogs) -> Any:
        """`task.aggregate_logs(state, step_logs)`.

        Args:
            state: the state so far (None before the first step of an evaluation).
            step_logs: each extra entry of `validation_step` mapped to a list with one NumPy array per replica, of
                every worker.
        """
        return self.task.aggregate_logs(state, step_logs)

    def results(self, state: Any, global_step: int) -> Dict[str, Any]:
        """`task.reduce_aggregated_logs(state, global_step)`.

        Args:
            state: the state after the evaluation's last step.
            global_step: the global step the evaluation ran at.
        """
        return self.task.reduce_aggregated_logs(state, global_step=global_step)


def of_task(task) -> List[Aggregation]:
    """Every aggregation of `task`: its own `aggregate_logs` (if overridden), then its reducers.

    Args:
        task: a `ctl.Task`.

    Returns:
        The aggregations, in the order they run on each eval step.
    """
    own = [TaskAggregation(task)] if task.aggregates_logs() else []
    return own + list(task.build_reducers())

