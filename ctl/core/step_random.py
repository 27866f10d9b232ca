"""The train step's random draws as functions of the step: a resumed run draws what the
uninterrupted run drew.

TensorFlow's stateful random ops (`tf.random.uniform`, `tf.random.shuffle`, ...) keep their
state in their kernels, in no checkpoint: a process restarted from a checkpoint draws from
their start, not from where the stopped run was. Model Garden's models draw from them inside
the train step (stochastic depth, the R-CNNs' proposal sampling, ELECTRA's generator), so a
resume after kill -9 or SIGTERM trains on other numbers.

With `ctl.FaultTolerance.stateless_random_ops` (which needs a seed), the Trainer traces the
task's train step inside `drawn_per_step`: there, `tf.random.uniform`, `normal`,
`truncated_normal`, `shuffle` and `categorical` draw from their stateless twins instead, each
seeded by the run's seed, the call's place in the step's trace, the global step, the replica
and the micro-batch. A draw then depends only on where it is, never on how many draws came
before in this process, so a run resumed at any step draws what the uninterrupted run drew
there. The numbers differ from those of the stateful ops (Model Garden's `train_lib` draws
from those), and a call inside a `tf.while_loop` of the model draws the same numbers on each
of its iterations. What the step draws otherwise (TensorFlow's own uses of the stateful ops,
such as `tf.nn.dropout`) is left as it is, and named at start
(`ctl.core.evaluation.stateful_random_ops` on the traced loop).

The five functions of `tf.random` are replaced once, at the first use, by functions that draw
statelessly only on a thread inside `drawn_per_step`, and as before everywhere else (the
input pipeline, the eval step traced on another thread after the first train loop).
"""

import contextlib
import threading
from typing import Callable, Dict, Iterator, Optional

import tensorflow as tf

# The functions of `tf.random` replaced, by name, with the stateless draw that stands in.
DRAWS = ("uniform", "normal", "truncated_normal", "shuffle", "categorical")

_local = threading.local()  # `.seeds`: the `_Seeds` of the trace running on this thread.
_original: Dict[str, Callable] = {}  # `tf.random`'s own functions, once replaced.
_replacing = threading.Lock()


class _Seeds:
    """Seeds for the draws of one trace: a new one for each call, in the order of the calls."""

    def __init__(self, seed: int, step: tf.Tensor, replica, micro_batch):
        self.base = tf.stack([tf.constant(seed, tf.int64), tf.cast(step, tf.int64)])
        self.replica, self.micro_batch = replica, micro_batch
        self.calls = 0

    def next(self, op_seed: Optional[int]) -> tf.Tensor:
        """The seed of the next call in the trace; `op_seed` is the call's own `seed=`."""
        self.calls += 1
        seed = tf.random.experimental.stateless_fold_in(self.base, self.calls)
        if op_seed is not None:
            seed = tf.random.experimental.stateless_fold_in(seed, op_seed)
        seed = tf.random.experimental.stateless_fold_in(seed, self.replica)
        return tf.random.experimental.stateless_fold_in(seed, self.micro_batch)


def _uniform(seeds, shape, minval=0, maxval=None, dtype=tf.float32, seed=None, name=None):
    return tf.random.stateless_uniform(shape, seeds.next(seed), minval=minval, maxval=maxval,
                                       dtype=dtype, name=name)


def _normal(seeds, shape, mean=0.0, stddev=1.0, dtype=tf.float32, seed=None, name=None):
    return tf.random.stateless_normal(shape, seeds.next(seed), mean=mean, stddev=stddev,
                                      dtype=dtype, name=name)


def _truncated_normal(seeds, shape, mean=0.0, stddev=1.0, dtype=tf.float32, seed=None,
                      name=None):
    return tf.random.stateless_truncated_normal(shape, seeds.next(seed), mean=mean,
                                                stddev=stddev, dtype=dtype, name=name)


def _shuffle(seeds, value, seed=None, name=None):
    return tf.random.experimental.stateless_shuffle(value, seeds.next(seed), name=name)


def _categorical(seeds, logits, num_samples, dtype=None, seed=None, name=None):
    return tf.random.stateless_categorical(logits, num_samples, seeds.next(seed),
                                           dtype=dtype or tf.int64, name=name)


_STATELESS = {"uniform": _uniform, "normal": _normal, "truncated_normal": _truncated_normal,
              "shuffle": _shuffle, "categorical": _categorical}


def _dispatching(name: str) -> Callable:
    original, stateless = tf.random.__dict__[name], _STATELESS[name]

    def draw(*args, **kwargs):
        seeds = getattr(_local, "seeds", None)
        if seeds is None:  # Not in a train step traced by `drawn_per_step` on this thread.
            return original(*args, **kwargs)
        return stateless(seeds, *args, **kwargs)

    draw.__doc__, draw.__name__ = original.__doc__, original.__name__
    draw.__wrapped__ = original  # type: ignore[attr-defined]
    return draw


def _replace_once() -> None:
    with _replacing:
        if _original:
            return
        for name in DRAWS:
            _original[name] = tf.random.__dict__[name]
            setattr(tf.random, name, _dispatching(name))


@contextlib.contextmanager
def drawn_per_step(seed: int, step: tf.Variable, micro_batch=0) -> Iterator[None]:
    """Within: on this thread, the five draws of `tf.random` (`DRAWS`) are stateless, seeded
    by `seed`, the call's place, the value of `step`, the replica and `micro_batch`. Enter it
    around the task's train step on one replica, inside the traced function.

    Args:
        seed: the run's seed (`ctl.FaultTolerance.seed`).
        step: the global step (read as each draw's seed is made).
        micro_batch: which of the step's micro-batches (gradient accumulation), a scalar.
    """
    _replace_once()
    context = tf.distribute.get_replica_context()
    replica = context.replica_id_in_sync_group if context is not None else 0
    outer = getattr(_local, "seeds", None)
    _local.seeds = _Seeds(seed, step, replica, micro_batch)
    try:
        yield
    finally:
        _local.seeds = outer
