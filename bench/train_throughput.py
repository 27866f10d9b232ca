"""Figure 1: train throughput of ctl, orbit and Keras `fit`, as ratios to a raw loop.

    python -m bench.train_throughput [--rounds 30] [--loops 5]

Per workload (mlp: overhead-bound, cnn: compute-bound), the loops train
`loops * steps_per_loop` steps per round, interleaved; one JSON line per loop
kind with the median steps/sec and its ratio to raw's, and the same ratio in
CPU time of this process (`cpu_ratio_to_raw`), which load from other processes
disturbs less.

Keras `fit` is measured last, against raw again, in the same process: its
input pipeline's threads outlive each `fit` call and took a few percent of the
CPU from whichever loop ran after it (measured: ctl 0.97 of raw without `fit`
in the process, 0.88-0.93 with it), so it is built only once the main
comparison (raw, raw_fused, ctl, orbit) is done.
"""

import argparse
import functools

from bench import loops, measure
from bench.workloads import BenchTask

BUILDERS = {
    "raw": loops.raw_train,
    "raw_fused": functools.partial(loops.raw_train, fused=True),
    "ctl": loops.ctl_train,
    "orbit": loops.orbit_train,
}
TARGET = 0.98


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--loops", type=int, default=5, help="loops per round (mlp); cnn: a fifth")
    parser.add_argument("--steps_per_loop", type=int, default=100)
    parser.add_argument("--workloads", default="mlp,cnn")
    args = parser.parse_args()
    measure.claim_stdout()
    for workload in args.workloads.split(","):
        loops_per_round = args.loops if workload == "mlp" else max(1, args.loops // 5)
        steps = loops_per_round * args.steps_per_loop
        fields = dict(workload=workload, steps_per_loop=args.steps_per_loop,
                      steps_per_round=steps, rounds=args.rounds)
        runs = {name: build(BenchTask(workload), args.steps_per_loop)
                for name, build in BUILDERS.items()}
        _compare(runs, steps, args.rounds, fields)
        keras_fit = loops.keras_fit(BenchTask(workload), args.steps_per_loop)
        _compare({"raw": runs["raw"], "keras_fit": keras_fit}, steps, args.rounds,
                 {**fields, "measured": "after the others, against raw again"}, skip=["raw"])


def _compare(runs, steps, rounds, fields, skip=()):
    cpu = {}
    times = measure.interleave({n: (lambda r=r: r(steps)) for n, r in runs.items()}, rounds, cpu=cpu)
    measure.emit_throughput("train_throughput", times, cpu, steps, TARGET, skip=skip, **fields)


if __name__ == "__main__":
    main()
