"""Restart at a new size: how many examples of the train input a run has consumed.

A cluster manager may bring a job back with fewer or more workers, or a run
may be resumed with another replica count (`--strategy=mirrored
--cpu_replicas=2` on a default-strategy checkpoint). The global step then
still says how many optimizer steps were taken, but no longer where the input
is: the data are sharded over another number of input pipelines and cut into
other per-replica batches. What carries over is the number of examples
consumed, so the checkpoint records it (`train_examples`, five int64s):

    [examples consumed before `step`, step, input pipelines, replicas, per-replica batch]

where `step` is where the run last changed size (0 if it never did), so that a
run resumed at the same size writes the same record as an uninterrupted one;
at step S it has consumed `examples + (S - step) * replicas * per-replica batch`. A resume that finds
another size continues at that many examples: every pipeline of the new size
skips its share, rounded down to whole batches, and one WARNING says the run
is no longer bit-identical to an uninterrupted one (other shards, other
reduction order). Parameter servers are not covered: their workers each read
the whole, shuffled train set.
"""

import dataclasses
from typing import Optional, Tuple

import tensorflow as tf

TRAIN_EXAMPLES = "train_examples"
_KEY = TRAIN_EXAMPLES + "/.ATTRIBUTES/VARIABLE_VALUE"


@dataclasses.dataclass(frozen=True)
class InputSize:
    """How a run reads its train input: pipelines (workers), replicas, per-replica batch (None: not static).

    Args:
        pipelines: input pipelines (one per worker).
        replicas: replicas in sync.
        per_replica_batch: each replica's batch size; None: not static.
    """

    pipelines: int
    replicas: int
    per_replica_batch: Optional[int]

    @property
    def global_batch(self) -> Optional[int]:
        return None if self.per_replica_batch is None else self.per_replica_batch * self.replicas

    def __str__(self) -> str:
        batch = self.global_batch if self.global_batch is not None else "unknown"
        return (f"{self.pipelines} input pipeline(s), {self.replicas} replica(s), "
                f"global batch {batch}")


def input_size(strategy: tf.distribute.Strategy, build_inputs,
               probe: Optional[tf.data.Dataset] = None) -> Optional[InputSize]:
    """The size of a run under `strategy` (None under parameter servers), probing one train pipeline.

    Args:
        strategy: the run's strategy.
        build_inputs: the Trainer's `checked_inputs`, called for one train pipeline.
        probe: a train pipeline built for one pipeline of one replica
            (`ctl.faults.resume.probe_pipeline`): read instead of a new one where
            the run is that size.
    """
    if isinstance(strategy, tf.distribute.ParameterServerStrategy):
        return None
    pipelines = 1
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is not None and resolver.task_type:
        jobs = resolver.cluster_spec().as_dict()
        pipelines = len(jobs.get("chief", ())) + len(jobs.get("worker", ()))
    replicas = strategy.num_replicas_in_sync
    if probe is None or (pipelines, replicas) != (1, 1):
        context = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=0,
                                             num_replicas_in_sync=replicas)
        probe = build_inputs(True, context)
    spec = tf.nest.flatten(probe.element_spec)[0]
    batch = spec.shape[0] if spec.shape.rank else None
    return InputSize(pipelines, replicas, batch)


@dataclasses.dataclass(frozen=True)
class Segment:
    """The run since its size last changed: `examples` consumed before `step`, read at `size` since.

    Args:
        examples: train examples consumed before `step`.
        step: the step the size last changed at.
        size: how the run has read its input since.
    """

    examples: int
    step: int
    size: InputSize

    def examples_at(self, step: int) -> int:
        """The examples consumed before `step`.

        Args:
            step: a step of this segment.
        """
        return self.examples + (step - self.step) * (self.size.global_batch or 0)


class ExamplesRecord:
    """The `train_examples` variable of the checkpoint (host side, eager)."""

    def __init__(self):
        self.variable = tf.Variable(tf.zeros([5], tf.int64), trainable=False, name="ctl_train_examples")

    def set(self, segment: Segment) -> None:
        """Records `segment` in the checkpoint's variable.

        Args:
            segment: the run's current segment.
        """
        size = segment.size
        self.variable.assign([segment.examples, segment.step, size.pipelines, size.replicas,
                              size.per_replica_batch or 0])


def recorded(path: str) -> Optional[Segment]:
    """The segment recorded in checkpoint `path`, if it has one with a known batch.

    Args:
        path: a checkpoint prefix.
    """
    reader = tf.train.load_checkpoint(path)
    if not reader.has_tensor(_KEY):
        return None
    examples, step, pipelines, replicas, batch = (int(v) for v in reader.get_tensor(_KEY))
    segment = Segment(examples, step, InputSize(pipelines, replicas, batch or None))
    return segment if segment.size.global_batch is not None else None


def elements_to_skip(examples: int, size: InputSize) -> Tuple[int, int]:
    """(elements of each pipeline to skip, examples that are read again) to resume after `examples`.

    Args:
        examples: the examples consumed before the resume.
        size: the run's size now.
    """
    per_pipeline_batch = size.per_replica_batch * size.pipelines
    return examples // per_pipeline_batch, examples % per_pipeline_batch
