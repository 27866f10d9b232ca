"""ctl.core.direct_call: a loop's `tf.function`, called through its concrete function."""

import tensorflow as tf

from ctl.core.direct_call import DirectCall


class Counted:
    """A `tf.function` that counts the calls that go through it (its trace lookup)."""

    def __init__(self, function):
        self.function = function
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1
        return self.function(*args)

    def get_concrete_function(self, *args):
        return self.function.get_concrete_function(*args)


def sum_batches(strategy, iterator, num_steps):
    """The sum of the next `num_steps` batches of `iterator`, over all replicas (traced)."""
    total = tf.constant(0.0, tf.float64)
    for _ in tf.range(num_steps):
        batch_sums = strategy.run(
            lambda batch: tf.reduce_sum(tf.cast(batch, tf.float64)), args=(next(iterator),))
        total += strategy.reduce(tf.distribute.ReduceOp.SUM, batch_sums, axis=None)
    return total


def summing_loop(strategy, python_calls=None):
    """`loop(iterator, num_steps)`: `sum_batches`, as a counted `tf.function`."""
    def loop(iterator, num_steps):
        if python_calls is not None:
            python_calls.append(1)
        return sum_batches(strategy, iterator, num_steps)

    return Counted(tf.function(loop))


def batches(strategy, dtype=tf.int64):
    data = tf.data.Dataset.range(1000).map(lambda x: tf.cast(x, dtype)).batch(4)
    if strategy is tf.distribute.get_strategy():
        return data
    return strategy.experimental_distribute_dataset(data)


def first_batches_sum(count: int) -> float:
    return float(sum(range(4 * count)))


def test_a_loop_finds_its_trace_once_for_inputs_of_the_same_types(strategy):
    """New iterators of one dataset and new step counts: one call goes through the tf.function."""
    counted = summing_loop(strategy)
    loop, dataset = DirectCall(counted), batches(strategy)
    for steps in (2, 3, 5):  # A fresh iterator each time, as an evaluation makes.
        total = loop(iter(dataset), tf.constant(steps), key=dataset)
        assert float(total) == first_batches_sum(steps)
    iterator = iter(dataset)  # One iterator across calls, as training keeps.
    loop(iterator, tf.constant(2), key=dataset)
    assert float(loop(iterator, tf.constant(1), key=dataset)) == first_batches_sum(3) - \
        first_batches_sum(2)
    assert counted.calls == 1


def test_inputs_of_other_types_go_through_the_tf_function(strategy):
    counted = summing_loop(strategy)
    loop, ints, floats = DirectCall(counted), batches(strategy), batches(strategy, tf.float32)
    assert float(loop(iter(ints), tf.constant(2), key=ints)) == first_batches_sum(2)
    assert float(loop(iter(floats), tf.constant(3), key=floats)) == first_batches_sum(3)
    assert float(loop(iter(ints), tf.constant(4, tf.int64), key=ints)) == first_batches_sum(4)
    assert counted.calls == 3
    # Python numbers are part of a trace: each value has its own.
    for steps in (2, 3, 2, 3):
        assert float(loop(iter(ints), steps, key=ints)) == first_batches_sum(steps)
    assert counted.calls == 5


def test_every_call_runs_eagerly_while_functions_run_eagerly():
    python_calls = []
    dataset = batches(tf.distribute.get_strategy())
    loop = DirectCall(summing_loop(tf.distribute.get_strategy(), python_calls))
    loop(iter(dataset), tf.constant(1), key=dataset)
    tf.config.run_functions_eagerly(True)
    try:
        for steps in (1, 2):
            assert float(loop(iter(dataset), tf.constant(steps), key=dataset)) == \
                first_batches_sum(steps)
    finally:
        tf.config.run_functions_eagerly(False)
    assert len(python_calls) == 3  # The trace, then each eager call.


def test_it_keeps_the_most_recent_traces(monkeypatch):
    monkeypatch.setattr(DirectCall, "KEPT", 2)
    counted = summing_loop(tf.distribute.get_strategy())
    loop = DirectCall(counted)
    datasets = [batches(tf.distribute.get_strategy()) for _ in range(3)]
    for dataset in [*datasets, datasets[0], datasets[2]]:  # The first is dropped, the last kept.
        assert float(loop(iter(dataset), tf.constant(2), key=dataset)) == first_batches_sum(2)
    assert counted.calls == 4


def test_a_nest_of_new_iterators_finds_the_kept_trace():
    """A dict of iterators, new each call (an evaluation of several inputs), is matched too."""
    strategy = tf.distribute.get_strategy()
    counted = Counted(tf.function(lambda iterators, num_steps: sum(
        sum_batches(strategy, iterator, num_steps) for iterator in iterators.values())))
    datasets = {"a": batches(strategy), "b": batches(strategy)}
    loop = DirectCall(counted)
    for steps in (1, 2):
        iterators = {name: iter(dataset) for name, dataset in datasets.items()}
        assert float(loop(iterators, tf.constant(steps), key=datasets)) == \
            2 * first_batches_sum(steps)
    assert counted.calls == 1
