"""Figure 12: a hyperparameter sweep on digits, ctl.sweep against KerasTuner and a plain Optuna loop.

    PYTHONPATH=. .venv/bin/python -m bench.sweep [--out FILE.jsonl] [--systems A,B,...]

One line per system, on one model and one data split (experiments/digits.py's
MLP and experiments/digits_data.py's held-out fifth):

- `ctl_sweep`: `python -m ctl.sweep --gin_file=configs/digits.gin
  --sweep_file=configs/digits_sweep.toml --workers=2` (12 trials, TPE, ASHA at
  each evaluation, each trial a ctl run (`ctl.sweep.trial`) forked by its worker's
  launcher); `ctl_sweep_process_per_trial` the same with `--fork_trials=false`
  (each trial a new process: what a trial pays for its own TensorFlow import);
- `ctl_sweep_hyperband_wall`: the same sweep file with `trials = 100` and
  `timeout` = KerasTuner Hyperband's wall time as just measured (no trial
  starts after it): an equal wall budget;
- `keras_tuner_hyperband` and `keras_tuner_random`: KerasTuner's Hyperband
  (`max_epochs` the sweep's longest run in epochs, factor 3) and RandomSearch
  (12 trials) over the same learning rate and width, at digits.gin's batch
  size (a tuner's search space holds the model's, not `fit`'s), `fit` with the
  held-out split as validation data, in this process;
- `optuna_fit`: a plain Optuna study (TPE, seed 0, 12 trials, no pruning) over
  the sweep's whole space, each trial one `fit` in this process.

Each line gives the best held-out accuracy, the wall time of the whole search,
the time at which the best-so-far first reached `--target` (digits.gin's
defaults: 0.9861), and, for ctl, the best it had reached by each other
system's wall time (`ctl_best_by_<system>_s`). What a ctl trial pays beyond its
training (a process, TensorFlow's import, the run's start) is `trial_overhead_s`:
a trial's wall time minus the seconds its train loops report.
A measurement, not a test: the machine's load is recorded with it.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP_FILE = os.path.join(ROOT, "configs", "digits_sweep.toml")
TRIALS = 12
EQUAL_WALL_TRIALS = 100  # At Hyperband's wall time: a budget its timeout, not this, ends (2026-11-27).
BATCH_SIZE = 64  # configs/digits.gin's


def space():
    with open(SWEEP_FILE, "rb") as f:
        return tomllib.load(f)["space"]


def data():
    from experiments.digits_data import load_split

    return load_split(True), load_split(False)


def steps_per_epoch(batch_size: int) -> int:
    (images, _), _ = data()
    return max(1, len(images) // batch_size)


def reached(events, target):
    """The first time (s from the start) at which the best-so-far accuracy reached `target`."""
    best = 0.0
    for seconds, accuracy in sorted(events):
        best = max(best, accuracy)
        if best >= target:
            return round(seconds, 2)
    return None


def best_by(events, seconds):
    values = [accuracy for at, accuracy in events if at <= seconds]
    return max(values) if values else None


def sweep_file(tmp, trials, timeout):
    """The shipped sweep file with another budget and a timeout (a copy in `tmp`, same study name)."""
    with open(SWEEP_FILE) as f:
        text = f.read()
    text, count = re.subn(r"(?m)^trials = \d+$", f"trials = {trials}"
                          + (f"\ntimeout = {timeout:.0f}" if timeout else ""), text)
    assert count == 1, "configs/digits_sweep.toml has no `trials = N` line"
    path = os.path.join(tmp, os.path.basename(SWEEP_FILE))
    with open(path, "w") as f:
        f.write(text)
    return path


def ctl_sweep(system="ctl_sweep", trials=TRIALS, timeout=None, fork=True):
    import optuna

    from ctl.sweep import study as sweep_study

    with tempfile.TemporaryDirectory() as tmp:
        sweep_dir = os.path.join(tmp, "sweep")
        started = time.time()
        done = subprocess.run([sys.executable, "-m", "ctl.sweep", "--gin_file=configs/digits.gin",
                               f"--sweep_file={sweep_file(tmp, trials, timeout)}",
                               f"--sweep_dir={sweep_dir}", "--workers=2",
                               f"--fork_trials={str(fork).lower()}"],
                              cwd=ROOT, capture_output=True, text=True, timeout=3600,
                              env={**os.environ, "PYTHONPATH": ROOT})
        wall = time.time() - started
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-2000:])
        storage = sweep_study.open_storage(sweep_dir, None)
        name = optuna.get_all_study_names(storage)[0]
        trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
        events, overheads = [], []
        for trial in trials:
            if trial.value is None or trial.datetime_complete is None:
                continue
            events.append((trial.datetime_complete.timestamp() - started, trial.value))
            train_s = _train_seconds(os.path.join(sweep_dir, "trials", str(trial.number)))
            if train_s is not None:
                overheads.append((trial.datetime_complete - trial.datetime_start).total_seconds() - train_s)
        overheads.sort()
        ended = [t for t in trials if t.state.is_finished()]
        with open(SWEEP_FILE, "rb") as f:
            value = tomllib.load(f).get("value", "best")
        return {"system": system, "trial_value": value, "trials": len(ended),
                "trials_not_started": len(trials) - len(ended),
                "timeout_s": timeout, "fork_trials": fork, "wall_s": round(wall, 2),
                "best_accuracy": max(v for _, v in events), "events": events,
                "trial_overhead_s": round(overheads[len(overheads) // 2], 2) if overheads else None}


def _train_seconds(model_dir):
    """The seconds a trial's train loops report (metrics.jsonl's train records: steps / steps_per_sec)."""
    from ctl.model_dir import ModelDir

    records = ModelDir(model_dir).metrics("train")
    total, last_step = 0.0, 0
    for record in records:
        rate, step = record.get("steps_per_sec"), record.get("step")
        if isinstance(rate, (int, float)) and rate > 0 and isinstance(step, int):
            total += (step - last_step) / rate
            last_step = step
    return total if records else None


def build_model(hidden_units, learning_rate):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(hidden_units, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(keras.optimizers.Adam(learning_rate),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def keras_tuner(kind):
    import keras
    import keras_tuner as kt

    sweep = space()
    low, high = sweep["DigitsTask.learning_rate"]["log_uniform"]
    units = sweep["DigitsTask.hidden_units"]["choice"]
    (x, y), (vx, vy) = data()
    max_epochs = -(-sweep["TRAIN_STEPS"]["int_uniform"][1] // steps_per_epoch(BATCH_SIZE))
    events, started = [], time.time()

    class Record(keras.callbacks.Callback):
        def on_train_end(self, logs=None):
            best = max(self.model.history.history.get("val_accuracy", [0.0]))
            events.append((time.time() - started, float(best)))

    def model_fn(hp):
        return build_model(hp.Choice("hidden_units", units),
                           hp.Float("learning_rate", low, high, sampling="log"))

    with tempfile.TemporaryDirectory() as tmp:
        common = dict(objective="val_accuracy", directory=tmp, project_name=kind, seed=0,
                      overwrite=True)
        if kind == "hyperband":
            tuner = kt.Hyperband(model_fn, max_epochs=max_epochs, factor=3, **common)
            tuner.search(x, y, batch_size=BATCH_SIZE, validation_data=(vx, vy), verbose=0,
                         callbacks=[Record()])
        else:
            tuner = kt.RandomSearch(model_fn, max_trials=TRIALS, **common)
            tuner.search(x, y, batch_size=BATCH_SIZE, epochs=-(-2000 // steps_per_epoch(BATCH_SIZE)),
                         validation_data=(vx, vy), verbose=0, callbacks=[Record()])
        wall = time.time() - started
        trials = len(tuner.oracle.trials)
    return {"system": f"keras_tuner_{kind}", "trials": trials, "wall_s": round(wall, 2),
            "best_accuracy": max(v for _, v in events), "events": events}


def optuna_fit():
    import optuna

    sweep = space()
    (x, y), (vx, vy) = data()
    events, started = [], time.time()

    def objective(trial):
        batch = trial.suggest_categorical("BATCH_SIZE", sweep["BATCH_SIZE"]["choice"])
        steps = trial.suggest_int("TRAIN_STEPS", *sweep["TRAIN_STEPS"]["int_uniform"])
        model = build_model(trial.suggest_categorical("hidden_units", sweep["DigitsTask.hidden_units"]["choice"]),
                            trial.suggest_float("learning_rate", *sweep["DigitsTask.learning_rate"]["log_uniform"],
                                                log=True))
        model.fit(x, y, batch_size=batch, epochs=-(-steps // steps_per_epoch(batch)), verbose=0)
        accuracy = float(model.evaluate(vx, vy, verbose=0)[1])
        events.append((time.time() - started, accuracy))
        return accuracy

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
    study.optimize(objective, n_trials=TRIALS)
    return {"system": "optuna_fit", "trials": TRIALS, "wall_s": round(time.time() - started, 2),
            "best_accuracy": study.best_value, "events": events}


SYSTEMS = {
    "ctl_sweep_process_per_trial": lambda: ctl_sweep("ctl_sweep_process_per_trial", fork=False),
    "ctl_sweep": ctl_sweep,
    "keras_tuner_hyperband": lambda: keras_tuner("hyperband"),
    "ctl_sweep_hyperband_wall": None,  # Hyperband's wall time as its timeout: in `main`.
    # The same 100 trials with no timeout, before Hyperband: its best by Hyperband's wall time is
    # `ctl_best_by_keras_tuner_hyperband_s` (a shorter run when the host is loaded).
    "ctl_sweep_100": lambda: ctl_sweep("ctl_sweep_100", trials=EQUAL_WALL_TRIALS),
    "keras_tuner_random": lambda: keras_tuner("random"),
    "optuna_fit": optuna_fit,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", type=float, default=0.9861)
    parser.add_argument("--out", default=None, help="Also append the lines to this file.")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help="Which lines, in this order (ctl_sweep_hyperband_wall needs "
                        "keras_tuner_hyperband before it); the goal's three: ctl_sweep,"
                        "keras_tuner_hyperband,ctl_sweep_hyperband_wall.")
    args = parser.parse_args()
    lines = []
    for system in args.systems.split(","):
        if system == "ctl_sweep_hyperband_wall":
            # Hyperband's wall time as ctl's budget: no trial starts after it (`timeout`), with
            # trials enough to fill it (or end sooner).
            wall = next(line["wall_s"] for line in lines if line["system"] == "keras_tuner_hyperband")
            lines.append(ctl_sweep(system, trials=EQUAL_WALL_TRIALS, timeout=wall))
        else:
            lines.append(SYSTEMS[system]())
        lines[-1]["load_average"] = round(os.getloadavg()[0], 2)
        lines[-1]["ended_utc"] = time.strftime("%H:%M:%S", time.gmtime())
        if args.out:  # Each line as soon as it is measured (the comparisons come at the end).
            with open(args.out + ".partial", "a") as f:
                f.write(json.dumps(lines[-1]) + "\n")
    for line in lines:
        line["seconds_to_target"] = reached(line["events"], args.target)
        line["target"] = args.target
    for ctl in lines:
        if ctl["system"].startswith("ctl_"):
            for other in lines:
                if not other["system"].startswith("ctl_"):
                    ctl[f"ctl_best_by_{other['system']}_s"] = best_by(ctl["events"], other["wall_s"])
    for line in lines:
        line.pop("events")
        text = json.dumps(line)
        print(text, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(text + "\n")


if __name__ == "__main__":
    main()
