"""Figure 2: eval throughput of ctl's evaluator vs a raw `tf.function` eval loop.

    python -m bench.eval_throughput [--rounds 25] [--evals 5]

Each round runs `evals` evaluations of `eval_steps` batches per variant, each
from a fresh iterator (as every evaluation does). ctl's goes through
`Controller.evaluate`: metrics reset, the `tf.while_loop` eval loop, results
read back and written as summaries. Each variant runs in `--instances`
copies built in balanced order (`measure.build_balanced`).

The target is on `ctl_twin`: the fused hand-written loop over the same model
and eval dataset as ctl's copy (`loops.ctl_eval_and_twin`), so that the two
differ in their loops alone. Like ctl, the twin ends each finished iterator on
a thread of its own: winding down a pipeline's threads on the caller's path
took 0.5-1.6 ms an MLP evaluation in one process, and ctl's CNN evaluations of
this figure ran 1.25 times as fast once it stopped (2026-11-25f), so a twin
without it is not the best hand-written loop. `ctl_twin_in_place` is that
twin ending its iterators in place, as the raw loops do. Separately built
copies differ by themselves: `raw_fused_b`, a second build of `raw_fused`, is the A/A check that shows by
how much (its `ratio_to_raw_fused` on the MLP ran from 0.92 to 1.02 over the
three processes of `bench/results/2026-11-25b-throughput.json`: as far from
1 as ctl's own gap).
"""

import argparse

from bench import loops, measure
from bench.workloads import BenchTask

TARGET = 0.98


def main():
    parser = argparse.ArgumentParser()
    measure.add_balanced_flags(parser, rounds=25)
    parser.add_argument("--evals", type=int, default=5, help="evaluations per round (mlp); cnn: a fifth")
    parser.add_argument("--eval_steps", type=int, default=100)
    args, seed = measure.start(parser)
    for workload in args.workloads.split(","):
        evals = args.evals if workload == "mlp" else max(1, args.evals // 5)
        runs = measure.build_balanced({
            "raw": lambda: loops.raw_eval(BenchTask(workload)),
            "raw_fused": lambda: loops.raw_eval(BenchTask(workload), fused=True),
            "raw_fused_b": lambda: loops.raw_eval(BenchTask(workload), fused=True),
            "ctl": lambda: loops.ctl_eval_and_twin(BenchTask(workload))}, args.instances, seed)
        runs["ctl"], runs["ctl_twin"], runs["ctl_twin_in_place"], _ = map(list, zip(*runs["ctl"]))

        def repeat(instances):
            return lambda: [evaluate(args.eval_steps) for evaluate in instances for _ in range(evals)]

        cpu = {}
        times = measure.interleave({n: repeat(e) for n, e in runs.items()}, args.rounds, cpu=cpu,
                                   seed=seed)
        steps = evals * args.eval_steps * args.instances
        measure.emit_throughput("eval_throughput", times, cpu, steps, TARGET, reference="ctl_twin",
                                workload=workload,
                                eval_steps=args.eval_steps, evals_per_round=evals,
                                rounds=args.rounds, instances=args.instances, order_seed=seed)


if __name__ == "__main__":
    main()
