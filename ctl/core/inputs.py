"""`Inputs`: the Trainer's datasets, from the task's `build_inputs` to what the replicas read.

ctl's `Trainer` inherits it (as it inherits `ctl.core.evaluation.Evaluation`). The task's
datasets are checked against the Task contract (`ctl.core.contract.inputs`: the train set
repeated) and distributed under the Trainer's strategy; under `ParameterServerStrategy` each
worker builds its own copy, through a `ClusterCoordinator` (`init_async`, `join`: the names
Model Garden's trainer uses). A subclass may override these methods, as the Trainer's other
override points.
"""

from typing import Any, Dict, Optional

import orbit
import tensorflow as tf

from ctl.core import contract
from ctl.utils.errors import UserError


class Inputs:
    """The Trainer's input pipelines: checked, distributed, per worker under parameter servers.

    The Trainer sets `strategy` and `task` before it calls `init_async` and builds
    its datasets (`train_dataset`, `eval_sets`) with these methods.
    """

    strategy: tf.distribute.Strategy  # Set by the Trainer, as `task`.
    task: Any
    _coordinator: Optional[tf.distribute.coordinator.ClusterCoordinator]

    def distribute_dataset(self, dataset_or_fn, *args, **kwargs):
        """Distributes a dataset, or a function `fn(*args, input_context, **kwargs)`.

        Under parameter servers each worker builds its own copy of the dataset
        (`ClusterCoordinator.create_per_worker_dataset`).

        Args:
            dataset_or_fn: a `tf.data.Dataset`, or a function that builds one from an `input_context`.
            *args: passed on to the function.
            **kwargs: passed on to the function.

        Returns:
            The distributed dataset (a per-worker dataset under parameter servers).

        Raises:
            UserError: tf.data or the strategy refuses a value the task was configured with (e.g. a batch size of 0).
        """
        if self._coordinator is not None:
            per_worker_fn = tf.function(lambda: orbit.utils.make_distributed_dataset(
                self.strategy, dataset_or_fn, *args, **kwargs))
            return self._coordinator.create_per_worker_dataset(per_worker_fn)
        try:
            return orbit.utils.make_distributed_dataset(
                self.strategy, dataset_or_fn, *args, **kwargs
            )
        except (tf.errors.InvalidArgumentError, ValueError) as error:
            # A value the task was configured with that tf.data or the strategy
            # refuses (a batch size of 0, one the replicas cannot split).
            text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise UserError(
                f"{type(self.task).__name__} cannot build its input pipeline ({text}); check "
                "the task's settings in the gin config (e.g. its batch size)."
            ) from error

    # Parameter-server training (the names Model Garden's trainer uses).

    def init_async(self) -> None:
        """Creates the `ClusterCoordinator` under `ParameterServerStrategy` (eager)."""
        self._coordinator = None
        if isinstance(self.strategy, tf.distribute.ParameterServerStrategy):
            self._coordinator = tf.distribute.coordinator.ClusterCoordinator(self.strategy)

    def join(self) -> None:
        """Waits for every scheduled step (eager); a no-op without parameter servers."""
        if self._coordinator is not None:
            self._coordinator.join()

    # The task's datasets, as the Trainer reads them.

    def build_eval_sets(self) -> Dict[Optional[str], Any]:
        """The task's eval datasets, distributed, by name (`None`: the one unnamed set).

        With names (`Task.eval_datasets()`), `build_inputs(training=False,
        input_context, name=NAME)` is called once per name.
        """
        names = tuple(self.task.eval_datasets())
        if not names:
            return {None: self.distribute_dataset(self.checked_inputs, training=False)}
        return {name: self.distribute_dataset(self.checked_inputs, training=False, name=name)
                for name in names}

    def checked_inputs(self, training: bool, input_context=None, **kwargs):
        """`task.build_inputs(...)` as ctl reads it: checked, the train set repeated
        (`ctl.core.contract.inputs`).

        Args:
            training: True for the train set, False for an eval set.
            input_context: the `tf.distribute.InputContext` of this input pipeline (None outside a strategy's call).
            **kwargs: passed on to `build_inputs` (`name=` for a named eval set).

        Returns:
            The task's dataset, checked against the Task contract; a train set that ends is repeated.
        """
        dataset = contract.inputs(self.task, training, input_context, **kwargs)
        if not training and tf.executing_eagerly():  # For `eval_set_length`.
            lengths = self.__dict__.setdefault("_eval_set_lengths", {})
            lengths[kwargs.get("name")] = int(dataset.cardinality())
        return dataset

    def eval_set_length(self, name: Optional[str] = None) -> Optional[int]:
        """The cardinality of eval set `name` as `checked_inputs` last built it
        (`tf.data.INFINITE_CARDINALITY`: it repeats), or None if it has not built it.

        Args:
            name: the eval set's name (None: the one unnamed set).
        """
        return self.__dict__.get("_eval_set_lengths", {}).get(name)
