"""Host aggregation of eval outputs: the `Reducer` protocol and how the Trainer drives it.

A Keras metric keeps a fixed set of variables that replicas sum; an exact AUC,
a median or a per-example dump needs every output of the eval set. A reducer
gets them on the host, batch by batch and replica by replica:

    states = [reducer.initial_state() for each replica of every worker]
    for each eval step:                         # eager, NumPy values
      for each replica r:
        states[r] = reducer.accumulate(states[r], logs of replica r's batch)
    return reducer.result(reducer.combine(states))

`logs` holds the extra entries of the task's `validation_step` (everything but
"loss"). The Trainer gathers them from every replica of every worker, so each
worker computes the same result, whatever the number of replicas or workers.
A task returns its reducers from `Task.build_reducers()`.
"""

import abc
from typing import Any, Dict, List, Mapping, Sequence

import numpy as np


class Reducer(abc.ABC):
    """Accumulates per replica batch, combines across replicas, then results."""

    def initial_state(self) -> Any:
        """The state of a replica that has seen no batch."""
        return None

    @abc.abstractmethod
    def accumulate(self, state: Any, logs: Mapping[str, np.ndarray]) -> Any:
        """Folds one replica's batch into that replica's `state`; returns the new state."""

    @abc.abstractmethod
    def combine(self, states: Sequence[Any]) -> Any:
        """Combines the states of all replicas (of all workers) into one."""

    @abc.abstractmethod
    def result(self, state: Any) -> Dict[str, Any]:
        """Named results of the combined state."""


def start(reducers: Sequence[Reducer]) -> List[List[Any]]:
    """Per reducer, the list of per-replica states (empty until the first step)."""
    return [[] for _ in reducers]


def accumulate(reducers: Sequence[Reducer], states: List[List[Any]],
               step_logs: Mapping[str, Sequence[np.ndarray]]) -> List[List[Any]]:
    """Folds one step's logs (name -> one array per replica) into `states`."""
    replicas = len(next(iter(step_logs.values()))) if step_logs else 0
    for reducer, per_replica in zip(reducers, states):
        while len(per_replica) < replicas:
            per_replica.append(reducer.initial_state())
        for r in range(replicas):
            per_replica[r] = reducer.accumulate(
                per_replica[r], {name: values[r] for name, values in step_logs.items()})
    return states


def results(reducers: Sequence[Reducer], states: List[List[Any]]) -> Dict[str, Any]:
    """Combines each reducer's replica states and returns all results."""
    logs = {}
    for reducer, per_replica in zip(reducers, states):
        logs.update(reducer.result(reducer.combine(per_replica or [reducer.initial_state()])))
    return logs
