"""Figure 1: train throughput of ctl, orbit and Keras `fit`, as ratios to a raw loop.

    python -m bench.train_throughput [--rounds 7] [--loops 5]

Per workload (mlp: overhead-bound, cnn: compute-bound), all four loops train
`loops * steps_per_loop` steps per round, interleaved; one JSON line per loop
kind with the median steps/sec and its ratio to raw's, and the same ratio in
CPU time of this process (`cpu_ratio_to_raw`), which load from other processes
disturbs far less.
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
    "keras_fit": loops.keras_fit,
}
TARGET = 0.98


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--loops", type=int, default=10, help="loops per round (mlp); cnn: a tenth")
    parser.add_argument("--steps_per_loop", type=int, default=100)
    parser.add_argument("--workloads", default="mlp,cnn")
    args = parser.parse_args()
    measure.claim_stdout()
    for workload in args.workloads.split(","):
        loops_per_round = args.loops if workload == "mlp" else max(1, args.loops // 10)
        steps = loops_per_round * args.steps_per_loop
        runs = {name: build(BenchTask(workload), args.steps_per_loop)
                for name, build in BUILDERS.items()}
        cpu = {}
        times = measure.interleave({n: (lambda r=r: r(steps)) for n, r in runs.items()},
                                   args.rounds, cpu=cpu)
        measure.emit_throughput("train_throughput", times, cpu, steps, TARGET, workload=workload,
                                steps_per_loop=args.steps_per_loop, steps_per_round=steps,
                                rounds=args.rounds)


if __name__ == "__main__":
    main()
