"""Train-step settings: XLA and bfloat16 in ctl's train step, against ctl without them and Keras `fit` with them.

    python -m bench.train_step_speed [--rounds 8] [--workloads mlp,cnn] [--settings xla,bfloat16]

Per workload (mlp: overhead-bound, cnn: compute-bound) and setting
(`xla`: `ctl.Trainer.jit_compile=True` / `fit(jit_compile=True)`; `bfloat16`:
`ctl.Trainer.mixed_precision='mixed_bfloat16'` / the same Keras policy while the
model is built), four variants are timed interleaved: ctl without the setting,
ctl with it, Keras `fit` without it and `fit` with it, each from the same
`BenchTask`. One JSON line per workload and setting: the steps/sec of each, the
setting's speedup in ctl (`ctl_speedup`: with / without) and in Keras
(`keras_speedup`), and ctl with the setting against `fit` with it
(`ratio_to_keras_fit`). Keras `fit` compiles with `jit_compile=False` when it
is not asked for XLA (its "auto" turns XLA off on a CPU-only host anyway).
"""

import argparse

from bench import loops, measure
from bench.workloads import BenchTask

SETTINGS = {
    "xla": ({"jit_compile": True}, {"jit_compile": True}),
    "bfloat16": ({"mixed_precision": "mixed_bfloat16"}, {"mixed_precision": "mixed_bfloat16"}),
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--loops", type=int, default=5, help="loops per round (mlp); cnn: a fifth")
    parser.add_argument("--steps_per_loop", type=int, default=100)
    parser.add_argument("--workloads", default="mlp,cnn")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    args = parser.parse_args()
    measure.claim_stdout()
    for workload in args.workloads.split(","):
        loops_per_round = args.loops if workload == "mlp" else max(1, args.loops // 5)
        steps = loops_per_round * args.steps_per_loop
        for setting in args.settings.split(","):
            ctl_settings, keras_settings = SETTINGS[setting]
            build = {
                "ctl": lambda: loops.ctl_train(BenchTask(workload), args.steps_per_loop),
                f"ctl_{setting}": lambda: loops.ctl_train(
                    BenchTask(workload), args.steps_per_loop, **ctl_settings),
                "keras_fit": lambda: loops.keras_fit(
                    BenchTask(workload), args.steps_per_loop, steps_per_call=steps),
                f"keras_fit_{setting}": lambda: loops.keras_fit(
                    BenchTask(workload), args.steps_per_loop, steps_per_call=steps,
                    **keras_settings),
            }
            runs = {name: make() for name, make in build.items()}
            times = measure.interleave({n: (lambda r=r: r(steps)) for n, r in runs.items()},
                                       args.rounds)
            rate = {name: steps / measure.median(t) for name, t in times.items()}
            measure.emit(
                "train_step_speed", workload=workload, setting=setting, steps_per_round=steps,
                rounds=args.rounds, steps_per_sec=rate,
                ctl_speedup=measure.ratio(times["ctl"], times[f"ctl_{setting}"]),
                keras_speedup=measure.ratio(times["keras_fit"], times[f"keras_fit_{setting}"]),
                ratio_to_keras_fit=measure.ratio(times[f"keras_fit_{setting}"],
                                                 times[f"ctl_{setting}"]))


if __name__ == "__main__":
    main()
