"""Figure 2: eval throughput of ctl's evaluator vs a raw `tf.function` eval loop.

    python -m bench.eval_throughput [--rounds 25] [--evals 5]

Each round runs `evals` evaluations of `eval_steps` batches per variant, each
from a fresh iterator (as every evaluation does). ctl's goes through
`Controller.evaluate`: metrics reset, the `tf.while_loop` eval loop, results
read back and written as summaries.
"""

import argparse

from bench import loops, measure
from bench.workloads import BenchTask

TARGET = 0.98


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--evals", type=int, default=5, help="evaluations per round (mlp); cnn: a fifth")
    parser.add_argument("--eval_steps", type=int, default=100)
    parser.add_argument("--workloads", default="mlp,cnn")
    args = parser.parse_args()
    measure.claim_stdout()
    for workload in args.workloads.split(","):
        evals = args.evals if workload == "mlp" else max(1, args.evals // 5)
        runs = {"raw": loops.raw_eval(BenchTask(workload)),
                "raw_fused": loops.raw_eval(BenchTask(workload), fused=True),
                "ctl": loops.ctl_eval(BenchTask(workload))}

        def repeat(evaluate):
            return lambda: [evaluate(args.eval_steps) for _ in range(evals)]

        cpu = {}
        times = measure.interleave({n: repeat(e) for n, e in runs.items()}, args.rounds, cpu=cpu)
        steps = evals * args.eval_steps
        measure.emit_throughput("eval_throughput", times, cpu, steps, TARGET, workload=workload,
                                eval_steps=args.eval_steps, evals_per_round=evals,
                                rounds=args.rounds)


if __name__ == "__main__":
    main()
