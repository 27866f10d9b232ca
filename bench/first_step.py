"""Figure 14: from launch to the first completed step, split by phase; ctl against `train_lib`.

    python -m bench.first_step [--experiments=digits,image_classification,...] [--rounds=1]
                               [--steps=4] [--out=FILE]

Each run is a process of its own, launched by this one: ctl, Model Garden's
`train_lib` (`official.core.train_lib.run_experiment`) and, on `digits`,
Keras `fit`. On a Model Garden experiment both trainers run what a zoo row runs
(`bench.model_garden_zoo.compare.run_ctl` / `run_train_lib`: the tiny variant,
its generated files, `--steps` steps in loops of one step, from one initial
checkpoint copied into a fresh model dir per run); on `digits`,
`configs/digits.gin`'s job (`python -m ctl.run --mode=train_and_eval`, run as
`__main__`) against `bench/mg_digits.py`'s Model Garden task and Keras `fit`
of the same MLP, each `--steps` steps in loops of one. A round runs every
trainer twice, in the order A B .. B A, so that each trainer's two runs are
its A/A pair: `aa_spread_s` is the largest gap between two runs of one
trainer.

The child wraps the trainers' own functions with wall-clock timers (exclusive
time: a phase inside another counts only once) and stops the clock when the
first train loop (one step) returns:

    import       `import tensorflow`, the trainer's library, Model Garden's registry
    build        the model, optimizer and datasets (ctl's `build_run`, Model Garden's
                 `train_utils.create_trainer`; Keras: model, compile, dataset)
    restore      the controller's `restore_checkpoint`
    checks       ctl's `contract.check_run` (Model Garden and Keras have none)
    input        ctl's probe of the input position (`FaultHandler.resume_inputs`)
    tracing      the trainer's `train_step` while the first loop traces it (Keras: the
                 model's `train_step`), and how many times it was traced (`traces`)
    first_step   the rest of the first loop: its iterator, graph optimization, the
                 first batch, the step
    rest         everything else before the first step (the config, the task object,
                 the controller, the model dir's files, the interpreter's start)

Prints one JSON line per experiment and trainer (`seconds` median, `runs`,
`phases` medians, `aa_spread_s`, `load_average`), and one per experiment with
`ctl_over_train_lib` (median over ctl's runs over train_lib's).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_EXPERIMENTS = ("digits,image_classification,retinanet_resnetfpn_coco,"
                       "bert/sentence_prediction")
PHASES = ("import", "build", "restore", "checks", "input", "tracing", "first_step", "rest")
MARK = "FIRST-STEP "


# The child: one trainer, timed.


class Clock:
    """Exclusive wall time per phase until `done()`; phases may nest."""

    def __init__(self, launched: float):
        self.launched = launched
        self.seconds: Dict[str, float] = {name: 0.0 for name in PHASES}
        self.traces = 0
        self.finished = None  # time.time() at the first completed step.
        self._stack: List[List[float]] = []  # [start, time in children]

    def phase(self, name: str, fn: Callable, once: bool = False) -> Callable:
        """`fn`, timed as `name` until the first step is done (with `once`, its first call only)."""
        calls = []

        def timed(*args, **kwargs):
            if self.finished is not None or (once and calls):
                return fn(*args, **kwargs)
            calls.append(1)
            self._stack.append([time.time(), 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                start, inner = self._stack.pop()
                elapsed = time.time() - start
                if self.finished is None or start < self.finished:
                    self.seconds[name] += elapsed - inner
                if self._stack:
                    self._stack[-1][1] += elapsed

        return timed

    def wrap(self, owner, attribute: str, name: str, once: bool = False) -> None:
        setattr(owner, attribute, self.phase(name, getattr(owner, attribute), once))

    def first_loop(self, owner, attribute: str) -> None:
        """`owner.attribute` (a train loop's call): its first call is the first step."""
        fn = getattr(owner, attribute)

        def timed(*args, **kwargs):
            if self.finished is not None:
                return fn(*args, **kwargs)
            result = self.phase("first_step", fn)(*args, **kwargs)
            self.finished = time.time()
            return result

        setattr(owner, attribute, timed)

    def tracing(self, owner, attribute: str) -> None:
        """`owner.attribute` (a train step, run only as it is traced): counted and timed."""
        fn = getattr(owner, attribute)

        def traced(*args, **kwargs):
            if self.finished is None:
                self.traces += 1
            return self.phase("tracing", fn)(*args, **kwargs)

        setattr(owner, attribute, traced)

    def report(self, **fields) -> None:
        total = self.finished - self.launched
        self.seconds["rest"] = total - sum(v for k, v in self.seconds.items() if k != "rest")
        print(MARK + json.dumps({"seconds": round(total, 3), "traces": self.traces,
                                 "phases": {k: round(v, 3) for k, v in self.seconds.items()},
                                 **fields}), flush=True)


def _child(args) -> None:
    clock = Clock(args.launched)
    start = time.time()
    import tensorflow as tf  # noqa: F401

    if args.trainer == "keras_fit":
        clock.seconds["import"] = time.time() - start
        return _keras_fit(clock, args)
    if args.experiment != "digits":  # Both trainers need the experiment registered.
        from bench.model_garden_zoo import registry

        registry.import_all()
    if args.trainer == "ctl":
        from ctl import train_lib as ctl_train_lib
        from ctl.core import contract, controller, trainer
        from ctl.faults import handler

        clock.seconds["import"] = time.time() - start
        clock.wrap(ctl_train_lib, "build_run", "build")
        clock.wrap(controller.Controller, "restore_checkpoint", "restore")
        clock.wrap(contract, "check_run", "checks")
        clock.wrap(handler.FaultHandler, "resume_inputs", "input")
        clock.tracing(trainer.Trainer, "train_step")
        clock.first_loop(trainer.Trainer, "train")
    else:
        import orbit
        from official.core import base_trainer, train_lib, train_utils  # noqa: F401

        if args.experiment != "digits":
            from ctl.adapters import model_garden  # noqa: F401 (what the zoo's train_lib arm imports)

        clock.seconds["import"] = time.time() - start
        clock.wrap(train_utils, "create_trainer", "build")
        clock.wrap(orbit.Controller, "restore_checkpoint", "restore")
        clock.tracing(base_trainer.Trainer, "train_step")
        clock.first_loop(orbit.StandardTrainer, "train")
    if args.experiment == "digits":
        _digits(args)
    else:
        from bench.model_garden_zoo import compare
        from ctl.adapters import model_garden

        overrides = compare.params_for(args.experiment, args.steps, os.path.join(args.workdir, "data"),
                                       args.eval_steps)
        if args.trainer == "ctl":
            compare.run_ctl(args.experiment, overrides, args.steps, args.model_dir, args.eval_steps)
        else:
            params = model_garden.experiment_config(args.experiment, params_override=overrides)
            compare.run_train_lib(params, args.model_dir)
    clock.report(trainer=args.trainer, experiment=args.experiment)


def _digits(args) -> None:
    if args.trainer == "ctl":
        import runpy

        sys.argv = ["ctl.run", "--mode=train_and_eval", "--gin_file=configs/digits.gin",
                    f"--model_dir={args.model_dir}", f"--gin.TRAIN_STEPS={args.steps}",
                    "--gin.ctl.Schedule.steps_per_loop=1",
                    f"--gin.ctl.Schedule.eval_interval={args.steps}",
                    f"--gin.ctl.Schedule.checkpoint_interval={args.steps}"]
        try:
            runpy.run_module("ctl.run", run_name="__main__")
        except SystemExit as error:
            if error.code:
                raise
        return
    import tensorflow as tf

    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import mg_digits
    from official.core import train_lib

    params = mg_digits.experiment_config(args.steps)
    params.trainer.steps_per_loop = 1
    params.trainer.summary_interval = 1
    params.trainer.validation_interval = args.steps
    params.trainer.checkpoint_interval = args.steps
    strategy = tf.distribute.get_strategy()
    with strategy.scope():
        task = mg_digits.DigitsTask(params.task)
    train_lib.run_experiment(strategy, task, "train_and_eval", params, args.model_dir)


def _keras_fit(clock: Clock, args) -> None:
    """configs/digits.gin's model, data, optimizer and loss under Keras 3's `fit`."""
    build = time.time()
    import keras
    import tensorflow as tf

    from experiments.digits_data import load_split

    class Timed(keras.Sequential):
        def train_step(self, data):
            if clock.finished is None:
                clock.traces += 1
            return clock.phase("tracing", super().train_step)(data)

    keras.utils.set_random_seed(0)
    model = Timed([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                   keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=[keras.metrics.SparseCategoricalAccuracy("accuracy")])
    images, labels = load_split(True)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().shuffle(
        len(labels), seed=0).batch(64, drop_remainder=True).prefetch(2)
    clock.seconds["build"] = time.time() - build

    class FirstStep(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 0:
                self.began = time.time()

        def on_train_batch_end(self, batch, logs=None):
            if batch == 0 and clock.finished is None:
                clock.finished = time.time()
                clock.seconds["first_step"] = clock.finished - self.began - clock.seconds["tracing"]

    model.fit(dataset, steps_per_epoch=args.steps, epochs=1, verbose=0, callbacks=[FirstStep()])
    clock.report(trainer=args.trainer, experiment=args.experiment)


# The parent: the runs, interleaved.


def _env(experiment: str) -> Dict[str, str]:
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    if experiment.endswith("_criteo") or "ranking" in experiment:  # The ranking family's names.
        env["TF_USE_LEGACY_KERAS"] = "1"  # tensorflow_recommenders refuses Keras 3 as tf.keras.
    return env


def _prepare(experiment: str, steps: int, workdir: str) -> Dict[str, Any]:
    """The zoo's data and initial checkpoint for `experiment`, in a child process."""
    template = os.path.join(workdir, "template", experiment.replace("/", "_"))
    code = ("import json, sys; from bench.model_garden_zoo import compare, registry; registry.import_all(); "
            "e, s, w, t = sys.argv[1:]; o = compare.params_for(e, int(s), w + '/data'); "
            "print('PREPARED ' + json.dumps(compare.write_initial_checkpoint(e, o, [t])))")
    out = subprocess.run([sys.executable, "-c", code, experiment, str(steps), workdir, template],
                         cwd=ROOT, env=_env(experiment), capture_output=True, text=True, check=False)
    for line in out.stdout.splitlines():
        if line.startswith("PREPARED "):
            return {"template": template, "eval_steps": json.loads(line[len("PREPARED "):])}
    raise RuntimeError(f"preparing {experiment} failed: {out.stderr[-2000:]}")


def _run(trainer: str, experiment: str, steps: int, workdir: str, prepared: Dict[str, Any],
         index: int) -> Dict[str, Any]:
    model_dir = os.path.join(workdir, "runs", f"{experiment.replace('/', '_')}-{trainer}-{index}")
    shutil.rmtree(model_dir, ignore_errors=True)
    if prepared.get("template"):
        shutil.copytree(prepared["template"], model_dir)
    command = [sys.executable, "-m", "bench.first_step", "--one", f"--trainer={trainer}",
               f"--experiment={experiment}", f"--steps={steps}", f"--workdir={workdir}",
               f"--model_dir={model_dir}", f"--eval_steps={prepared.get('eval_steps', -1)}"]
    launched = time.time()
    out = subprocess.run(command + [f"--launched={launched}"], cwd=ROOT, env=_env(experiment),
                         capture_output=True, text=True, check=False, timeout=1800)
    shutil.rmtree(model_dir, ignore_errors=True)
    for line in out.stdout.splitlines():
        if line.startswith(MARK):
            record = json.loads(line[len(MARK):])
            record["process_s"] = round(time.time() - launched, 3)
            return record
    raise RuntimeError(f"{trainer} on {experiment} failed (exit {out.returncode}): "
                       f"{out.stderr[-3000:]}")


def _median(values: List[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", default=DEFAULT_EXPERIMENTS)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--workdir", default="")
    parser.add_argument("--out", default="")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trainer", default="ctl")
    parser.add_argument("--experiment", default="digits")
    parser.add_argument("--model_dir", default="")
    parser.add_argument("--eval_steps", type=int, default=-1)
    parser.add_argument("--launched", type=float, default=0.0)
    args = parser.parse_args(argv)
    if args.one:
        _child(args)
        return 0
    workdir = args.workdir or tempfile.mkdtemp(prefix="ctl-first-step-")
    lines = []
    for experiment in args.experiments.split(","):
        trainers = ["ctl", "train_lib"] + (["keras_fit"] if experiment == "digits" else [])
        prepared = {} if experiment == "digits" else _prepare(experiment, args.steps, workdir)
        runs: Dict[str, List[Dict[str, Any]]] = {name: [] for name in trainers}
        for round_index in range(args.rounds):
            order = trainers if round_index % 2 == 0 else trainers[::-1]
            for trainer in order + order[::-1]:  # A B .. B A: each trainer's A/A pair.
                runs[trainer].append(_run(trainer, experiment, args.steps, workdir, prepared,
                                          len(runs[trainer])))
        for trainer, records in runs.items():
            seconds = [r["seconds"] for r in records]
            line = {"figure": "first_step", "experiment": experiment, "trainer": trainer,
                    "seconds": round(_median(seconds), 2), "runs": seconds,
                    "aa_spread_s": round(max(seconds) - min(seconds), 2),
                    "traces": [r["traces"] for r in records],
                    "phases": {p: round(_median([r["phases"][p] for r in records]), 2)
                               for p in PHASES},
                    "process_s": [r["process_s"] for r in records],
                    "load_average": round(os.getloadavg()[0], 2)}
            lines.append(line)
            print(json.dumps(line), flush=True)
        ctl_s = _median([r["seconds"] for r in runs["ctl"]])
        lib_s = _median([r["seconds"] for r in runs["train_lib"]])
        line = {"figure": "first_step", "experiment": experiment,
                "ctl_over_train_lib": round(ctl_s / lib_s, 3), "met": ctl_s <= lib_s,
                "load_average": round(os.getloadavg()[0], 2)}
        lines.append(line)
        print(json.dumps(line), flush=True)
    if args.out:
        with open(args.out, "w") as out:
            out.writelines(json.dumps(line) + "\n" for line in lines)
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
