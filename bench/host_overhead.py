"""Diagnostic: where ctl's host time goes after a train loop, piece by piece.

    python -m bench.host_overhead [--loops 200]

Not one of the issue's figures (`bench.run` does not run it): it times, right
after each 100-step MLP loop, each host step of `Controller._train_n_steps`
(the output and global step the loop handed back, each train action, the log
line, the summaries) and, for comparison, the raw loop's eager metric reset and read.
Prints one JSON line per piece with its median and mean in milliseconds
(the mean includes the summary flushes, every 5 s). Every piece
runs where it runs in a real loop, while TensorFlow's thread pools are still
busy, which is why they cost more here than timed alone.

Then, per call of a one-step `raw_fused` loop (interleaved, `--calls` a round):
what calling the loop costs through its `tf.function` (which finds its trace
again on every call; ctl's Trainer calls its loops so) and through the public
call of its concrete function.
"""

import argparse
import functools
import time

import tensorflow as tf

from bench import loops, measure
from bench.workloads import BenchTask
from ctl.core.controller import to_numpy


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--loops", type=int, default=200)
    parser.add_argument("--calls", type=int, default=300, help="one-step loop calls a round")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    measure.claim_stdout()
    trainer, controller = loops.ctl_controller(BenchTask("mlp"), steps_per_loop=100)
    raw = loops.raw_pieces(BenchTask("mlp"), steps_per_loop=100)
    num_steps = tf.constant(100, tf.int32)
    trainer.train(num_steps)
    times = {}

    def lap(name, start):
        now = time.perf_counter()
        times.setdefault(name, []).append(now - start)
        return now

    for _ in range(args.loops):
        t = time.perf_counter()
        for name, piece in raw:
            piece()
            t = lap(f"raw: {name}", t)
        end = trainer.train(num_steps)
        t = lap("ctl: trainer.train (the loop, one call, and its end step)", t)
        output = to_numpy(end.logs)
        t = lap("ctl: output to NumPy", t)
        step = end.step
        for handler in controller.between_loops.after_train_loop:
            end = handler(end)
            t = lap(f"ctl: after_train_loop {type(handler).__name__}", t)
        for action in controller.between_loops.train_actions:
            action(output)
            name = type(getattr(action, "__self__", action)).__name__
            t = lap(f"ctl: train action {name}", t)
        controller._train_lines.loop_end(step, step + 100, output, 100, 0.02, last=False)
        t = lap("ctl: log line (at most every 0.1 s)", t)
        controller.summary_manager.write_summaries(output, step=step)
        controller.summary_manager.flush_if_due()
        t = lap("ctl: summaries (kept; written every 5 s)", t)
    for name, values in times.items():
        measure.emit("host_overhead", piece=name, median_ms=1e3 * measure.median(values),
                     mean_ms=1e3 * sum(values) / len(values))
    calls(args.calls, args.rounds)


def calls(count: int, rounds: int) -> None:
    """Times a one-step loop's call two ways (see the module docstring)."""
    task = BenchTask("mlp")
    loop, iterator, _, _ = loops.raw_train_loop(task, fused=True)
    one = tf.constant(1)
    concrete = loop.get_concrete_function(iterator, one)
    ways = {"call: through tf.function (ctl's loops)": lambda: loop(iterator, one),
            "call: concrete function, public call": lambda: concrete(iterator, one)}

    def repeat(call):
        for _ in range(count):
            call()

    times = measure.interleave({name: functools.partial(repeat, call)
                                for name, call in ways.items()}, rounds)
    for name, values in times.items():
        measure.emit("host_overhead", piece=name, median_ms=1e3 * measure.median(values) / count,
                     mean_ms=1e3 * sum(values) / len(values) / count)


if __name__ == "__main__":
    main()
