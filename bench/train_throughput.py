"""Figure 1: train throughput of ctl, orbit and Keras `fit`, as ratios to hand-written loops.

    python -m bench.train_throughput [--rounds 15] [--loops 5] [--xla] [--variants ctl,orbit] [--seed N]

Per workload (mlp: overhead-bound, cnn: compute-bound), every variant trains
`loops * steps_per_loop` steps per round (cnn: a fifth of the loops), in calls
of `steps_per_loop` steps, interleaved (`measure.interleave`: balanced orders, a pause between calls;
each variant's places in the build and round orders drawn anew per process, `order_seed`);
each variant is set up once (in `--instances` copies, built in balanced order, each
round running every copy) and keeps its iterator (and its prefetch threads)
for the whole comparison, Keras `fit` included (one `fit` call, an epoch per
round: `bench.loops.keras_fit`). One JSON line per variant with the median
steps/sec, its ratio to `raw` and to `raw_fused` (the best loop one writes by
hand), in wall and in CPU time of this process (which load from other
processes disturbs less). ctl's target is on `ratio_to_raw_fused`.

`ctl_stop_per_loop` is ctl with `ctl.FaultTolerance.stop_check = 'loop'`: no
per-step stop/NaN guard, signals and bad losses looked for after each loop;
the guard's cost (`guard_cost`) is ctl's ratio over it, minus one. `raw_fused_b`, a
second build of `raw_fused`, is the A/A check: its ratio to `raw_fused` is what
separately built copies of one loop differ by. `--xla` adds Keras `fit(jit_compile=True)` and, if
this ctl has `ctl.Trainer(jit_compile=...)`, ctl with XLA.
"""

import argparse
import functools
import inspect
from typing import Optional

import ctl
from bench import loops, measure
from bench.workloads import BenchTask

BUILDERS = {
    "raw": loops.raw_train,
    "raw_fused": functools.partial(loops.raw_train, fused=True),
    # The A/A check: a second build of raw_fused, which shows by how much separately built
    # copies of one loop differ here (figure 2 has its own).
    "raw_fused_b": functools.partial(loops.raw_train, fused=True),
    "ctl": loops.ctl_train,
    "ctl_stop_per_loop": functools.partial(loops.ctl_train, stop_check="loop"),
    "orbit": loops.orbit_train,
}
TARGET = 0.98


def builders(steps_per_round: int, xla: bool, variants: Optional[str] = None):
    """The variants to build; `variants`: a comma-separated subset (raw and raw_fused, the
    references, are always kept)."""
    chosen = dict(BUILDERS)
    chosen["keras_fit"] = functools.partial(loops.keras_fit, steps_per_call=steps_per_round)
    if xla:
        chosen["keras_fit_xla"] = functools.partial(
            loops.keras_fit, steps_per_call=steps_per_round, jit_compile=True)
        if "jit_compile" in inspect.signature(ctl.Trainer.__init__).parameters:
            chosen["ctl_xla"] = functools.partial(loops.ctl_train, jit_compile=True)
    if variants is None:
        return chosen
    wanted = {"raw", "raw_fused", *variants.split(",")}
    unknown = wanted - set(chosen)
    if unknown:
        raise SystemExit(f"--variants: unknown {sorted(unknown)}; choose from {sorted(chosen)}")
    return {name: build for name, build in chosen.items() if name in wanted}


def main():
    parser = argparse.ArgumentParser()
    measure.add_balanced_flags(parser, rounds=15)
    parser.add_argument("--loops", type=int, default=5, help="loops per round (mlp); cnn: a fifth")
    parser.add_argument("--steps_per_loop", type=int, default=100)
    parser.add_argument("--xla", action="store_true", help="add Keras fit and ctl with XLA")
    parser.add_argument("--variants", default=None,
                        help="comma-separated subset of the variants (raw and raw_fused always run)")
    args, seed = measure.start(parser)
    for workload in args.workloads.split(","):
        loops_per_round = args.loops if workload == "mlp" else max(1, args.loops // 5)
        steps = loops_per_round * args.steps_per_loop
        runs = measure.build_balanced(
            {name: functools.partial(build, BenchTask(workload), args.steps_per_loop)
             for name, build in builders(steps, args.xla, args.variants).items()},
            args.instances, seed)
        cpu = {}
        times = measure.interleave({n: functools.partial(_each, r, steps) for n, r in runs.items()},
                                   args.rounds, cpu=cpu, seed=seed)
        measure.emit_throughput(
            "train_throughput", times, cpu, steps * args.instances, TARGET, workload=workload,
            steps_per_loop=args.steps_per_loop, steps_per_round=steps, rounds=args.rounds,
            instances=args.instances, order_seed=seed, targeted=("ctl", "ctl_stop_per_loop"),
            ctl_fields=(dict(guard_cost=measure.ratio(times["ctl"], times["ctl_stop_per_loop"]) - 1)
                        if {"ctl", "ctl_stop_per_loop"} <= set(times) else None))


def _each(instances, steps):
    for run in instances:
        run(steps)


if __name__ == "__main__":
    main()
