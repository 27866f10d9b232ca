"""Diagnostic: what ctl's per-step stop/NaN guard costs, against a loop without one.

    python -m bench.guard_designs [--rounds 30] [--copies 3]

Not one of the issue's figures (`bench.run` does not run it). One process,
one model, optimizer and iterator (the bench MLP); each loop design is traced
`copies` times (separately traced copies of one loop run up to 5% apart here,
so each design gets several) in balanced order, and all are called in turn,
in the orders of `measure.interleave`, 5 loops of 100 steps a call. Designs:

- none:     `for _ in tf.range(n)`-style loop, no guard (`i < n`);
- previous: ctl's guard until 2026-11-24: `i < n and not stop_requested`, the
            NaN verdict riding `i`;
- ctl:      `ctl.core.loops.StepGuard.graph_loop`, as the Trainer uses it.

Prints one JSON line per design: median ms a loop and its ratio to `none`.
"""

import argparse
import functools

import keras
import tensorflow as tf

from bench import measure
from bench.workloads import BenchTask
from ctl.core.loops import StepGuard
from ctl.core.stop import SignalWatcher

DESIGNS = ("none", "previous", "ctl")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--copies", type=int, default=3)
    args = parser.parse_args()
    measure.claim_stdout()
    task = BenchTask("mlp")
    model, optimizer = task.build_model(), task.build_optimizer()
    optimizer.build(model.trainable_variables)
    metrics = [keras.metrics.Mean("loss"), *task.build_metrics(training=True)]
    iterator = iter(task.build_inputs(training=True))
    global_step = tf.Variable(0, dtype=tf.int64)
    guard = StepGuard(SignalWatcher(), global_step)  # Never signalled: the watcher is not entered.

    def step(it):
        logs = task.train_step(next(it), model, optimizer, metrics[1:])
        metrics[0].update_state(logs["loss"])
        global_step.assign_add(1)
        return logs["loss"]

    def checked_step(it):  # What ctl's Trainer.train_step ends with, under a guard.
        return guard.check_loss(tf.distribute.get_strategy(), step(it), global_step)

    def build(design):
        loop = {"none": _unguarded(step), "previous": _previous(guard, checked_step),
                "ctl": guard.graph_loop(checked_step)}[design]

        @tf.function
        def call(it, num_steps):
            for metric in metrics:
                metric.reset_state()
            loop(it, num_steps)
            return {metric.name: metric.result() for metric in metrics}, global_step.read_value()

        num_steps = tf.constant(100)

        def run():
            for _ in range(5):
                results, step_now = call(iterator, num_steps)
                for value in [*results.values(), step_now]:  # Read back, as a controller does.
                    value.numpy()

        run()
        return run

    built = measure.build_balanced({d: functools.partial(build, d) for d in DESIGNS}, args.copies)
    times = measure.interleave(
        {f"{d}#{k}": run for d, runs in built.items() for k, run in enumerate(runs)}, args.rounds)
    by_design = {d: [t / 5 for k in range(args.copies) for t in times[f"{d}#{k}"]] for d in DESIGNS}
    for design in DESIGNS:
        measure.emit("guard_designs", design=design,
                     ms_per_loop=1e3 * measure.median(by_design[design]),
                     ratio_to_none=measure.ratio(by_design["none"], by_design[design]),
                     copies_ms=[1e3 * measure.median(times[f"{design}#{k}"]) / 5
                                for k in range(args.copies)],
                     rounds=args.rounds, copies=args.copies)


def _unguarded(step_fn):
    def loop_fn(iterator, num_steps):
        def body(i):
            step_fn(iterator)
            return (i + 1,)

        tf.while_loop(lambda i: i < num_steps, body, (tf.constant(0),))
    return loop_fn


def _previous(guard, step_fn):
    """The guard's loop as it was until 2026-11-24 (a read, a negation and a conjunction a step)."""
    def loop_fn(iterator, num_steps):
        bad = num_steps + 1

        def cond(i):
            return tf.logical_and(i < num_steps, tf.logical_not(guard.stop_requested.read_value()))

        def body(i):
            return (tf.where(step_fn(iterator), i + 1, bad),)

        end, = tf.while_loop(cond, body, (tf.constant(0),))
        guard.bad_step.assign(tf.where(end < bad, guard.bad_step.read_value(),
                                       guard.global_step.read_value()))
    return loop_fn


if __name__ == "__main__":
    main()
