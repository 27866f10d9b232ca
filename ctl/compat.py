"""The only place where ctl touches internals of its dependencies (TensorFlow, Keras, orbit, gin,
Model Garden): three entries.

Everything else in ctl uses public APIs. Each entry says why no public API
does the job, and `tests/test_compat.py` checks it against the installed
versions: the day a dependency moves the internal, that test fails and names
the dependency, its version and the entry.

1. `share_keras_cpu_twins(variables)`: asynchronous checkpoints of Keras 3
   models. TensorFlow's public `tf.train.CheckpointOptions(enable_async=True)`
   (orbit's `enable_async_checkpointing` passes the same option) copies each
   variable to a CPU twin inside one `tf.function`, through each trackable's
   `_copy_trackable_to_cpu`. Keras 3's TensorFlow `Variable` makes a new
   `tf.Variable` twin on every save, which a `tf.function` refuses after its
   first call: the second async save of any Keras 3 model fails (Keras 3.15,
   TF 2.20). The underlying `tf.Variable` (`variable.value`) keeps one twin
   that each copy refreshes, and both serialize to the same value, so each
   given variable (only those of ctl's checkpoint; nothing process-wide)
   shares that twin.
2. `registered_configurables()`, `registered_experiments()`: the names in a
   registry that has no public lister: gin's configurables, and Model Garden's
   experiments (`official.core.exp_factory` offers `register_config_factory`
   and `get_exp_config` only; its registry is the module's
   `_REGISTERED_CONFIGS`, a dict of dicts, which Model Garden's own API-docs
   builder reads too). ctl reads them only to suggest close matches for a
   misspelled name, and the zoo to list Model Garden's experiments.
   `registered_experiments()` raises if the registry moved, rather than
   listing nothing.
3. `checkpoint_object_graph(reader)`: the object graph a TF2 checkpoint stores
   (which object path holds which checkpoint key). `tf.train.Checkpoint.read`
   restores through it but reports no per-variable match, which warm start's
   report and the sidecar's checks need. The graph is part of TensorFlow's
   checkpoint format; its key and proto are not exported under `tf.*`.
"""

import types
from typing import Iterable, List

import gin
import tensorflow as tf

OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"  # tensorflow/python/checkpoint: OBJECT_GRAPH_PROTO_KEY


def share_keras_cpu_twins(variables: Iterable) -> int:
    """Lets these Keras 3 variables take part in repeated async checkpoint saves; returns how many.

    Variables that are not Keras 3 TensorFlow-backend variables (tf_keras, plain
    `tf.Variable`) are left alone: TensorFlow handles them.

    Args:
        variables: the checkpoint's variables (any kind: only Keras 3 ones are changed).
    """
    count = 0
    for variable in variables:
        underlying = getattr(variable, "value", None)
        if isinstance(variable, tf.Variable) or not isinstance(underlying, tf.Variable):
            continue
        if not hasattr(variable, "_copy_trackable_to_cpu"):
            continue
        object.__setattr__(variable, "_copy_trackable_to_cpu",
                           types.MethodType(_copy_via_underlying_twin, variable))
        count += 1
    return count


def _copy_via_underlying_twin(self, object_map):
    """Refreshes the CPU twin of the underlying `tf.Variable` and shares it."""
    self.value._copy_trackable_to_cpu(object_map)
    object_map[self] = object_map[self.value]


def registered_configurables() -> List[str]:
    """Every configurable gin knows, by its full name (e.g. `ctl.Schedule`)."""
    registry = getattr(gin.config, "_REGISTRY", None)
    return sorted(getattr(registry, "_selector_map", None) or {})


def registered_experiments() -> List[str]:
    """Every experiment Model Garden's `exp_factory` holds so far (nested names joined by '/').

    Raises:
        RuntimeError: `exp_factory` no longer keeps its registry as a dict in `_REGISTERED_CONFIGS`.
    """
    from official.core import exp_factory

    registry = getattr(exp_factory, "_REGISTERED_CONFIGS", None)
    if not isinstance(registry, dict):
        raise RuntimeError(
            "ctl.compat.registered_experiments: Model Garden's official.core.exp_factory has no "
            "dict _REGISTERED_CONFIGS any more (tf-models-official "
            f"{_version('tf-models-official')}); update this entry to where it keeps its "
            "experiments.")

    def flatten(entries, prefix=""):
        for key, value in entries.items():
            if isinstance(value, dict):
                yield from flatten(value, f"{prefix}{key}/")
            else:
                yield f"{prefix}{key}"

    return list(flatten(registry))


def _version(distribution: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"


def checkpoint_object_graph(reader):
    """The `TrackableObjectGraph` proto of the checkpoint `reader` reads (`tf.train.load_checkpoint`).

    Raises `ValueError` for a name-based (TF1) checkpoint, which has none.

    Args:
        reader: a `tf.train.load_checkpoint` reader.
    """
    from tensorflow.core.protobuf import trackable_object_graph_pb2  # The checkpoint format.

    if not reader.has_tensor(OBJECT_GRAPH_KEY):
        raise ValueError("a name-based (TF1) checkpoint: it has no object graph")
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor(OBJECT_GRAPH_KEY))
    return graph
