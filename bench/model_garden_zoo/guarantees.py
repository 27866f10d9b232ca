"""ctl's four guarantees on one experiment's tiny variant, each through `python -m ctl.run`.

    python -m bench.model_garden_zoo.guarantees NAME [--workdir=DIR] [--random_ops]
                                                [--train_lib_at_two_replicas] [--gradients]
                                                [--input_at_two_replicas]

The run is seeded as a user seeds theirs: `ctl.FaultTolerance.seed = 1` in the gin file (which
seeds Python, NumPy, TensorFlow and Keras, turns on op determinism and makes tf_keras draw
dropout from generators the checkpoint holds), with `ctl.FaultTolerance.stateless_random_ops =
True` (the train step's draws from `tf.random` as functions of the step: `ctl.core.step_random`;
a row whose train step makes no such draw runs as without it). The experiment runs with its real pipeline and
augmentations (the zoo's variant: bench/model_garden_zoo/variants.py) by the recorded task of
tests/model_garden_tasks.py, which writes each train step's loss bits from inside the graph and
can hold a step until told to go on, so that a process is stopped mid-loop, in a step it knows.
`STEPS` steps in loops of `LOOP`, a checkpoint after each loop:

- `kill_9`: killed (SIGKILL) while held in step `HOLD_AT`, after the checkpoint of step `LOOP`,
  then the same command: every step's loss and the final checkpoint bit for bit those of an
  uninterrupted run;
- `sigterm`: SIGTERM while held in step `HOLD_AT`: exit 75 before any further step, with a
  checkpoint of that step; then the same command: bit for bit again;
- `sidecar`: `--mode=continuous_eval` beside the killed and restarted trainer evaluates each
  checkpoint once, in order, with the experiment's metrics, exits 0 after the last one, and its
  results for the last one are the in-line evaluation of that same checkpoint: the uninterrupted
  run's where the two runs' last checkpoints are bit for bit the same, else (kill -9 does not
  hold) `--mode=eval` on a copy of the killed run's last checkpoint in a dir of its own;
- `new_replicas`: the SIGTERM-stopped run resumed with `--cpu_replicas=2 --strategy=mirrored`:
  it goes on at the next step, each step reads the uninterrupted run's data (the sum of its
  inputs; where it does not, `--input_at_two_replicas` says what Model Garden's own pipeline
  gives those steps at one replica and at two, with the augmentations it draws for each batch
  and without), its checkpoint's `train_examples` record counts the examples it read (each step's
  batches, as the recorded task writes them: the uninterrupted run's count where the task splits
  its global batch over the replicas; more where its input gives each replica a batch of its own
  size, as Model Garden's `mock` does, under Model Garden's trainer too), and its losses and
  weights differ from that run's by the reduction order only (the largest relative differences
  are reported).

Each prints `{"holds": bool, "detail": "..."}`: where one does not hold, the detail is the line a
user can check (the first differing step or weight, the exit status and the last line said).
Prints `ZOO-GUARANTEES {json}`; `python -m bench.model_garden_zoo --guarantees` runs it per row.
"""

import argparse
import importlib
import json
import math
import os
import resource
import shutil
import signal
import socket
import sys
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

STEPS, LOOP, HOLD_AT = 6, 2, 3  # Loops 1-2, 3-4, 5-6; held in step 3, after ckpt-2.
WAIT_S = 1200  # Bound on every wait for a process of the row (the 2-core host is shared).
REPLICA_TOLERANCE = 1e-3  # Relative: a difference beyond it at two replicas is more than the order.
INPUT_TOLERANCE = 1e-12  # Relative: a step's input sum, added in float64 by one replica or two.
EVAL_TOLERANCE = 1e-5
COLUMNS = ("kill_9", "sigterm", "sidecar", "new_replicas")


def _family_modules(family: str) -> List[str]:
    """The modules whose import registers the experiments of `family` (for the gin file)."""
    from bench.model_garden_zoo import registry

    if family == "ranking":
        return list(registry.RANKING)
    if family == "nlp":
        return registry._nlp_config_modules()  # noqa: SLF001 (the zoo's own module)
    return [registry.VISION]


def write_gin(path: str, experiment: str, family: str, data_dir: str) -> str:
    """The run's gin file: the zoo's variant, recorded steps, the seed, the schedule.

    Args:
      path: where to write it.
      experiment: a registered experiment's name.
      family: its family (registry.family).
      data_dir: the zoo's generated files.
    """
    from bench.model_garden_zoo import data, variants

    from official.core import exp_factory

    overrides = variants.overrides(experiment, STEPS) + data.data_overrides(experiment, data_dir)
    if getattr(exp_factory.get_exp_config(experiment).task, "init_checkpoint", ""):
        # A random start: its default checkpoint is in a public bucket (nothing is downloaded).
        overrides.append({"task": {"init_checkpoint": ""}})
    lines = [*(f"import {module}" for module in _family_modules(family)),
             "import tests.model_garden_tasks",
             "ctl.Experiment.task = @RecordedModelGardenTask()",
             "ctl.Experiment.trainer_cls = @StepTrainer",
             f"RecordedModelGardenTask.experiment = {experiment!r}",
             f"RecordedModelGardenTask.params_override = {overrides!r}",
             "ctl.FaultTolerance.seed = 1",
             "ctl.FaultTolerance.stateless_random_ops = True",
             f"ctl.Schedule.train_steps = {STEPS}", f"ctl.Schedule.steps_per_loop = {LOOP}",
             f"ctl.Schedule.checkpoint_interval = {LOOP}", f"ctl.Schedule.eval_interval = {STEPS}",
             # The whole generated eval set (the experiment's validation_steps count real data), or
             # the zoo's batches of one that never ends.
             f"ctl.Schedule.eval_steps = {_eval_steps(experiment, overrides)}", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


def _eval_steps(experiment: str, overrides) -> Optional[int]:
    """None (the whole set) for the variant's eval set, or `compare.EVAL_STEPS` if it never ends."""
    import ctl
    from bench.model_garden_zoo import compare

    steps = compare.eval_steps_of(ctl.ModelGardenTask(experiment=experiment, params_override=overrides))
    return None if steps == -1 else steps


class _Row:
    """One experiment's runs, in `workdir/guarantees/NAME/`."""

    def __init__(self, experiment: str, family: str, workdir: str):
        self.experiment, self.family, self.workdir = experiment, family, workdir
        self.root = os.path.join(workdir, "guarantees", experiment.replace("/", "_"))
        shutil.rmtree(self.root, ignore_errors=True)  # A fresh start (a row may be run again).
        os.makedirs(self.root)
        self.gin = write_gin(self.path("experiment.gin"), experiment, family,
                             os.path.join(workdir, "data"))
        self.env = {"TF_CPP_MIN_LOG_LEVEL": "2"}
        if family == "ranking":  # tensorflow_recommenders refuses Keras 3 as tf.keras.
            self.env["TF_USE_LEGACY_KERAS"] = "1"

    def path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def trainer(self, mode: str, model_dir: str, steps_file: str, *flags: str, hold: bool = False,
                env: Optional[Dict[str, str]] = None):
        from tests.support.processes import Process, ctl_command

        bindings = [f"RecordedModelGardenTask.steps_file='{steps_file}'",
                    f"RecordedModelGardenTask.inputs_file='{steps_file}.inputs'"]
        if hold:
            bindings += [f"RecordedModelGardenTask.hold_at_step={HOLD_AT}",
                         f"RecordedModelGardenTask.held_file='{self.path('held')}'",
                         f"RecordedModelGardenTask.release_file='{self.path('release')}'"]
        return Process(ctl_command(f"--mode={mode}", f"--model_dir={model_dir}",
                                   f"--gin_file={self.gin}", *flags,
                                   *(f"--gin_bindings={b}" for b in bindings)),
                       env={**self.env, **(env or {})})

    def held(self, process) -> None:
        """Waits until `process` is held in step HOLD_AT (the hold is armed again after)."""
        if not process.wait_until(lambda: os.path.exists(self.path("held")), timeout=WAIT_S):
            raise Failed(f"the run ended before step {HOLD_AT}: {_last_words(process)}")
        os.remove(self.path("held"))


class Failed(Exception):
    """A guarantee that does not hold, with the line that says why."""


def _last_words(process) -> str:
    """The process's exit status and the last line of ctl's (its whole output is kept beside its
    model dir, in `<model_dir>.log`, for the user to read)."""
    from tests.support.reading import ctl_stderr_lines

    model_dir = [a.split("=", 1)[1] for a in process.proc.args if a.startswith("--model_dir=")]
    if model_dir:
        with open(model_dir[0] + ".log", "w") as f:
            f.write(process.stdout() + "\n--- stderr ---\n" + process.stderr())
    lines = [line for line in ctl_stderr_lines(process.stderr() + process.stdout())
             if not line.lstrip().startswith(("ckpt |", "train |", "eval |"))]
    where = f" (its output: {model_dir[0]}.log)" if model_dir else ""
    return f"exit {process.returncode}: {(lines or ['no output'])[-1][:300]}{where}"


def _finished(process, what: str) -> None:
    result = process.finish(timeout=WAIT_S)
    if result.returncode != 0:
        raise Failed(f"{what} {_last_words(process)}")


def read_input_sums(path: str) -> Dict[int, float]:
    from tests.model_garden_tasks import read_input_sums as read

    return read(path)


def read_input_examples(path: str) -> Dict[int, int]:
    from tests.model_garden_tasks import read_input_examples as read

    return read(path)


def counted_examples(counted: Optional[int], uninterrupted: Optional[int],
                     reference_read: Dict[int, int], read: Dict[int, int]) -> Tuple[str, str]:
    """('', what was counted) where the `train_examples` records at step STEPS count the examples
    each run read, else (why not, ''): the uninterrupted run's steps 1..STEPS, and the run at two
    replicas steps 1..HOLD_AT on one replica (the uninterrupted run's, bit for bit: `sigterm`)
    and HOLD_AT+1..STEPS on two.

    The two counts are equal only where the task splits a global batch over the replicas; a
    task whose input gives each replica a batch of its own size (Model Garden's `mock`: 2) reads
    twice as many examples a step at two replicas, as under Model Garden's trainer, and ctl
    counts them (`ctl.faults.run_size`).

    Args:
      counted: the run at two replicas' record at step STEPS (`train_examples`; None or 0: no
        static batch size, nothing counted).
      uninterrupted: the uninterrupted run's.
      reference_read: step -> examples the uninterrupted run's step read (`read_input_examples`).
      read: step -> examples the run at two replicas' step read (its steps after HOLD_AT).
    """
    before = sum(reference_read.get(s, 0) for s in range(1, HOLD_AT + 1))
    after = sum(read.get(s, 0) for s in range(HOLD_AT + 1, STEPS + 1))
    reference = sum(reference_read.get(s, 0) for s in range(1, STEPS + 1))
    if not counted and not uninterrupted:  # None, or 0 with no batch size recorded.
        return "", "no examples counted (the batches have no static size: the resume skips by steps)"
    if not counted or not uninterrupted:
        return (f"at step {STEPS} the run at two replicas counts {counted} examples read, the "
                f"uninterrupted run {uninterrupted}"), ""
    if uninterrupted != reference:
        return (f"at step {STEPS} the uninterrupted run counts {uninterrupted} examples read, but "
                f"its steps read {reference}"), ""
    if counted != before + after:
        return (f"at step {STEPS} the run at two replicas counts {counted} examples read, but its "
                f"steps read {before + after} ({before} in steps 1-{HOLD_AT} on one replica, "
                f"{after} in steps {HOLD_AT + 1}-{STEPS} on two); the uninterrupted run "
                f"{uninterrupted}"), ""
    said = f"{counted} examples counted at step {STEPS}, those its steps read"
    if counted != uninterrupted:
        said += (f" (the task's input gives each replica a batch of its own size: {after} "
                 f"examples in steps {HOLD_AT + 1}-{STEPS} on two replicas, "
                 f"{reference - before} on one; the uninterrupted run counts {uninterrupted})")
    return "", said


def read_losses(path: str) -> List[Tuple[int, int]]:
    from tests.model_garden_tasks import read_losses as read

    return read(path)


def _bits_to_float(bits: int) -> float:
    import numpy as np

    return float(np.array([bits], np.int32).view(np.float32)[0])


def same_steps(reference: Dict[int, int], runs: List[Tuple[str, List[Tuple[int, int]]]],
               expected: List[List[int]]) -> str:
    """'' where each run recorded the `expected` steps with the reference's loss bits, else why.

    Args:
      reference: step -> loss bits of the uninterrupted run.
      runs: (name, recorded (step, bits)) of each process of the interrupted run.
      expected: the steps each process should have recorded.
    """
    for (name, recorded), steps in zip(runs, expected):
        if [s for s, _ in recorded] != steps:
            return f"the {name} process ran steps {[s for s, _ in recorded]}, not {steps}"
        for step, bits in recorded:
            if bits != reference.get(step):
                return (f"step {step}'s loss {_bits_to_float(bits)!r} ({name} process) vs "
                        f"{_bits_to_float(reference[step])!r} uninterrupted")
    return ""


def _why_other_losses(row: "_Row", difference: str, steps_file: str) -> str:
    """`difference`, and where it is a step's loss on the same data (its inputs' sum), which
    stateful random ops the train step draws from (checked once per row)."""
    if not difference.startswith("step "):
        return difference
    step = int(difference.split()[1].rstrip("'s"))
    ours = read_input_sums(steps_file + ".inputs").get(step)
    theirs = read_input_sums(row.path("reference.steps.inputs")).get(step)
    if ours is None or ours != theirs:
        return difference + f" (its inputs' sum {ours!r} vs {theirs!r}: other data)"
    if getattr(row, "random_ops", None) is None:
        row.random_ops = stateful_random_ops(row)
    return difference + f", on the same data (its inputs' sum): {row.random_ops}"


def _why_not_bit_identical(row: "_Row", difference: str) -> str:
    """`difference`, and where the resumed run read the same data and its train step draws from no
    stateful random op (or only the final checkpoint differs), whether Model Garden's own train
    step repeats its gradients, in one process and across `GRADIENT_PROCESSES` (`gradients_check`,
    once per row)."""
    if not difference or not (difference.startswith("final checkpoint: ")
                              or "holds no stateful random op" in difference):
        return difference
    if getattr(row, "gradients", None) is None:
        row.gradients = gradients_check(row.experiment, row.family, row.workdir)
    return f"{difference}; {row.gradients}"


def checkpoint_difference(path_a: str, path_b: str, tolerance: float = 0.0,
                          ignore: Tuple[str, ...] = ()) -> Tuple[str, float]:
    """('' or the first variable that differs by more than `tolerance`, the largest relative
    difference of any value) between two checkpoints.

    Args:
      path_a, path_b: checkpoint prefixes.
      tolerance: relative; 0: bit for bit.
      ignore: prefixes of variables left out.
    """
    import numpy as np

    from tests.support.reading import checkpoint_values

    a, b = ({k: v for k, v in checkpoint_values(p).items() if not (ignore and k.startswith(ignore))}
            for p in (path_a, path_b))
    if sorted(a) != sorted(b):
        return f"variables {sorted(set(a) ^ set(b))[:5]} are in one checkpoint only", math.inf
    worst, first = 0.0, ""
    for name in sorted(a):
        x, y = a[name], b[name]
        if x is None or x.tobytes() == y.tobytes():
            continue
        if x.dtype.kind not in "fc":
            rel = math.inf
        else:
            x64, y64 = x.astype(np.float64), y.astype(np.float64)
            scale = max(float(np.abs(x64).max(initial=0.0)), float(np.abs(y64).max(initial=0.0)), 1e-12)
            rel = float(np.abs(x64 - y64).max(initial=0.0)) / scale
        worst = max(worst, rel)
        if rel > tolerance and not first:
            differ = int((x != y).sum()) if x.shape == y.shape else x.size
            first = f"{name}: {differ} of {x.size} values differ (relative {rel:.2g})"
    return first, worst


def _latest(model_dir: str) -> str:
    import tensorflow as tf

    return tf.train.latest_checkpoint(model_dir) or ""


def _step(path: str) -> int:
    return int(path.rsplit("-", 1)[1]) if path else 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _relative(a: float, b: float) -> float:
    if a == b:
        return 0.0
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def reference_and_kill_9(row: _Row) -> Dict[str, Dict[str, Any]]:
    """The uninterrupted run beside the killed one (with the sidecar beside that): the `kill_9`
    and `sidecar` columns; the reference's losses and dir are kept on `row`."""
    from tests.support.processes import Process

    from ctl.model_dir import ModelDir

    reference, chaos = row.path("reference"), row.path("kill_9")
    steps = {name: row.path(f"{name}.steps") for name in ("reference", "kill_9")}
    # The trainer leaves evaluation to the evaluator TF_CONFIG names: the sidecar.
    tf_config = json.dumps({"cluster": {"chief": [f"127.0.0.1:{_free_port()}"],
                                        "evaluator": [f"127.0.0.1:{_free_port()}"]},
                            "task": {"type": "chief", "index": 0}})
    out: Dict[str, Dict[str, Any]] = {}
    with row.trainer("train_and_eval", reference, steps["reference"]) as straight, \
            Process.ctl("--mode=continuous_eval", f"--model_dir={chaos}", merge_stderr=True,
                        env=row.env) as sidecar:
        try:
            with row.trainer("train_and_eval", chaos, steps["kill_9"], hold=True,
                             env={"TF_CONFIG": tf_config}) as first:
                row.held(first)
                first.kill()
            killed_at = _step(_latest(chaos))
            before = read_losses(steps["kill_9"])
            open(row.path("release"), "w").close()  # The same command: its hold passes now.
            with row.trainer("train_and_eval", chaos, steps["kill_9"], hold=True,
                             env={"TF_CONFIG": tf_config}) as again:
                _finished(again, "the restarted run:")
            os.remove(row.path("release"))
            after = read_losses(steps["kill_9"])[len(before):]
            out["kill_9"] = {"killed_after_checkpoint": killed_at}
        except Failed as failed:
            out["kill_9"] = {"holds": False, "detail": str(failed)}
            sidecar.kill()  # It would wait for a final checkpoint that never comes.
            out["sidecar"] = {"holds": None, "detail": "not run: the trainer beside it failed"}
        _finished(straight, "the uninterrupted run:")
        row.reference = reference
        row.losses = dict(read_losses(steps["reference"]))
        if "holds" not in out["kill_9"]:
            difference = same_steps(row.losses, [("killed", before), ("restarted", after)],
                                    [list(range(1, HOLD_AT + 0)), list(range(LOOP + 1, STEPS + 1))])
            difference = _why_other_losses(row, difference, steps["kill_9"])
            if killed_at != LOOP:
                difference = f"killed with checkpoint {killed_at} the latest, not {LOOP}"
            if not difference:
                difference, _ = checkpoint_difference(_latest(reference), _latest(chaos))
                difference = difference and f"final checkpoint: {difference}"
            difference = _why_not_bit_identical(row, difference)
            out["kill_9"] = {"holds": not difference, "detail": difference or (
                f"killed in step {HOLD_AT} after ckpt-{LOOP}; steps {LOOP + 1}-{STEPS} again: "
                f"every loss and the final checkpoint bit for bit")}
        if "sidecar" not in out:
            try:
                status = sidecar.wait(timeout=WAIT_S)
            except Exception:  # noqa: BLE001 (a hang is the column's finding)
                status = None
            ran = _sidecar_ran(status, sidecar, ModelDir(chaos))
            out["sidecar"] = ran or sidecar_against_in_line(
                row, ModelDir(chaos).sidecar_evaluations()[-1]["results"], reference, chaos)
    return out


def _sidecar_ran(status, sidecar, chaos) -> Optional[Dict[str, Any]]:
    """The `sidecar` column where the sidecar did not evaluate each checkpoint once, in order, and
    exit 0; else None."""
    numbers = [r["number"] for r in chaos.sidecar_evaluations()]
    wanted = list(range(LOOP, STEPS + 1, LOOP))
    if status != 0:
        last = [line for line in sidecar.stdout().splitlines() if line.strip()][-1:] or ["no output"]
        return {"holds": False, "detail": f"the sidecar exited {status} after evaluating "
                f"{numbers}: {last[0][:300]}"}
    if numbers != wanted:
        return {"holds": False, "detail": f"the sidecar evaluated checkpoints {numbers}, not {wanted}"}
    return None


def sidecar_against_in_line(row: _Row, results: Dict[str, Any], reference: str,
                            chaos: str) -> Dict[str, Any]:
    """The `sidecar` column: the sidecar's `results` for the killed run's final checkpoint against
    the in-line evaluation of that same checkpoint. Where it is the uninterrupted run's final
    checkpoint, bit for bit, that is the uninterrupted run's in-line evaluation; else (kill -9
    does not hold) the killed run's checkpoint is evaluated as in-line evaluation evaluates it
    (`in_line_of_copy`). `holds` is None only where that evaluation fails.

    Args:
      row: the row (its gin file and dir).
      results: the sidecar's results for ckpt-STEPS of `chaos` (its `eval/metrics.jsonl` record's).
      reference: the uninterrupted run's model dir (evaluated in-line at step STEPS).
      chaos: the killed and restarted run's model dir (evaluated by the sidecar).
    """
    from ctl.model_dir import ModelDir

    ours, theirs = _latest(chaos), _latest(reference)
    if _step(ours) != STEPS or _step(theirs) != STEPS:
        return {"holds": False, "detail": f"final checkpoints ckpt-{_step(ours)} (killed run), "
                f"ckpt-{_step(theirs)} (uninterrupted run), not ckpt-{STEPS}"}
    differs, _ = checkpoint_difference(theirs, ours)
    if differs:
        whose = "the killed run's, whose checkpoint differs from the uninterrupted run's"
        try:
            inline = in_line_of_copy(row, ours)
        except Failed as failed:
            return {"holds": None, "detail": "each checkpoint once, in order, exit 0; its results "
                    f"not compared: the killed run's ckpt-{STEPS} differs from the uninterrupted "
                    f"run's ({differs}) and its in-line evaluation failed: {failed}"}
    else:
        whose = "the uninterrupted run's, whose checkpoint is the killed run's bit for bit"
        found = [r for r in ModelDir(reference).metrics("eval") if r.get("step") == STEPS]
        if not found:
            return {"holds": False, "detail": f"the uninterrupted run has no evaluation of step {STEPS}"}
        inline = found[-1]
    shared = sorted(k for k, v in inline.items() if k in results and isinstance(v, (int, float))
                    and not isinstance(v, bool) and k not in ("step", "time", "steps"))
    if not shared:
        return {"holds": False, "detail": f"no metric in both: sidecar {sorted(results)}, "
                f"in-line ({whose}) {sorted(inline)}"}
    diffs = {k: _relative(float(results[k]), float(inline[k])) for k in shared}
    off = {k: d for k, d in diffs.items() if not d <= EVAL_TOLERANCE}
    if off:
        return {"holds": False, "detail": "ckpt-%d: %s differ from the in-line evaluation of the "
                "same checkpoint (%s)" % (STEPS, ", ".join(f"{k} {results[k]!r} vs {inline[k]!r}"
                                                           for k in off), whose)}
    worst = max(diffs.values())
    return {"holds": True, "max_rel_diff": worst, "metrics": shared,
            "compared_with": "killed" if differs else "uninterrupted",
            "detail": f"checkpoints {list(range(LOOP, STEPS + 1, LOOP))} once each; "
                      f"ckpt-{STEPS}'s {', '.join(shared)} "
                      f"{'equal' if worst == 0 else 'within %.1g of' % worst} the in-line "
                      f"evaluation of the same checkpoint ({whose}); exit 0"}


def in_line_of_copy(row: _Row, checkpoint: str) -> Dict[str, Any]:
    """The in-line evaluation of `checkpoint`: `--mode=eval` (the controller's evaluation that
    `train_and_eval` makes between loops, of the same task and eval set) in a dir that holds a
    copy of that checkpoint alone (`kill_9-final/`), so that the dir it came from and the
    sidecar's records there are left as they are. Returns its `metrics.jsonl` record.

    Args:
      row: the row (its gin file and dir).
      checkpoint: the checkpoint's prefix (`.../ckpt-STEPS`).

    Raises:
      Failed: the evaluation failed or recorded no evaluation of step STEPS.
    """
    from ctl.model_dir import ModelDir, checkpoint_files

    copy = row.path("kill_9-final")
    shutil.rmtree(copy, ignore_errors=True)
    os.makedirs(copy)
    for name in checkpoint_files(checkpoint):
        shutil.copy(name, copy)
    with row.trainer("eval", copy, row.path("kill_9-final.steps")) as run:
        _finished(run, f"(--mode=eval on a copy of ckpt-{STEPS})")
    found = [r for r in ModelDir(copy).metrics("eval") if r.get("step") == STEPS]
    if not found:
        raise Failed(f"--mode=eval on a copy of ckpt-{STEPS} recorded no evaluation of step {STEPS}")
    return found[-1]


def sigterm_and_new_replicas(row: _Row) -> Dict[str, Dict[str, Any]]:
    """SIGTERM in step HOLD_AT, then the same command, and the stopped run resumed at two
    replicas (a copy of its dir): the `sigterm` and `new_replicas` columns."""
    model_dir, steps = row.path("sigterm"), row.path("sigterm.steps")
    out: Dict[str, Dict[str, Any]] = {}
    for name in ("held", "release"):  # The kill -9 run's restart held (and passed) step HOLD_AT too.
        if os.path.exists(row.path(name)):
            os.remove(row.path(name))
    try:
        with row.trainer("train", model_dir, steps, hold=True) as first:
            row.held(first)
            first.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            # Taken (the process says so, once its loops can read it) while the step runs; then
            # the step goes on.
            if not first.wait_until(lambda: "received SIGTERM" in first.stderr() + first.stdout(),
                                    timeout=WAIT_S):
                raise Failed(f"the run ended without saying it received SIGTERM: {_last_words(first)}")
            open(row.path("release"), "w").close()
            try:
                status = first.wait(timeout=WAIT_S)
            except Exception:  # noqa: BLE001
                raise Failed(f"no exit within {WAIT_S} s of the SIGTERM")
            took = time.monotonic() - signalled
        if status != 75:
            raise Failed(f"exit {status} after SIGTERM, not 75: {_last_words(first)}")
        stopped = read_losses(steps)
        saved = _step(_latest(model_dir))
        if [s for s, _ in stopped] != list(range(1, HOLD_AT + 1)) or saved != HOLD_AT:
            raise Failed(f"after SIGTERM in step {HOLD_AT}: steps {[s for s, _ in stopped]} ran, "
                         f"checkpoint {saved}")
        shutil.copytree(model_dir, row.path("replicas"))
        with row.trainer("train", model_dir, steps, hold=True) as again:
            _finished(again, "the restarted run:")
        difference = same_steps(row.losses, [("stopped", stopped),
                                             ("restarted", read_losses(steps)[len(stopped):])],
                                [list(range(1, HOLD_AT + 1)), list(range(HOLD_AT + 1, STEPS + 1))])
        difference = _why_other_losses(row, difference, steps)
        if not difference:
            difference, _ = checkpoint_difference(_latest(row.reference), _latest(model_dir))
            difference = difference and f"final checkpoint: {difference}"
        difference = _why_not_bit_identical(row, difference)
        out["sigterm"] = {"holds": not difference, "seconds_to_exit": round(took, 1),
                          "detail": difference or (
                              f"exit 75 {took:.0f} s after SIGTERM in step {HOLD_AT}, before step "
                              f"{HOLD_AT + 1}, with ckpt-{HOLD_AT}; steps {HOLD_AT + 1}-{STEPS} "
                              "again: every loss and the final checkpoint bit for bit")}
    except Failed as failed:
        out["sigterm"] = {"holds": False, "detail": str(failed)}
        out["new_replicas"] = {"holds": None, "detail": "not run: no run stopped by SIGTERM"}
        return out
    if os.path.exists(row.path("release")):
        os.remove(row.path("release"))
    try:
        out["new_replicas"] = _new_replicas(row)
    except Failed as failed:
        out["new_replicas"] = {"holds": False, "detail": str(failed)}
    return out


def train_examples(path: str) -> Optional[int]:
    """The examples of the train input a checkpoint's `train_examples` record counts at its step."""
    import tensorflow as tf

    from ctl.faults import run_size

    reader = tf.train.load_checkpoint(path)
    key = run_size.TRAIN_EXAMPLES + "/.ATTRIBUTES/VARIABLE_VALUE"
    if not reader.has_tensor(key):
        return None
    examples, since, pipelines, replicas, batch = (int(v) for v in reader.get_tensor(key))
    return examples + (_step(path) - since) * pipelines * replicas * batch


RANDOM_OPS_CHECK = "RANDOM-OPS "


def _check_in_process(row: _Row, flag: str, marker: str, what: str) -> str:
    """Runs this module with `flag` for the row in a process of its own; the last line it
    printed after `marker`, or why there is none."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run(
        [sys.executable, "-m", "bench.model_garden_zoo.guarantees", row.experiment,
         f"--family={row.family}", f"--workdir={row.workdir}", flag],
        cwd=root, capture_output=True, text=True, env={**os.environ, **row.env, "PYTHONPATH": root},
        timeout=WAIT_S, check=False)
    said = [line[len(marker):] for line in out.stdout.splitlines() if line.startswith(marker)]
    return said[-1] if said else f"{what} ended without a result (exit {out.returncode})"


def stateful_random_ops(row: _Row) -> str:
    """The stateful random ops in the row's train step (a check in a process of its own), as a
    sentence for the row."""
    return _check_in_process(row, "--random_ops", RANDOM_OPS_CHECK, "the random-ops check")


def _stateful_random_ops(experiment: str, workdir: str) -> str:
    import tensorflow as tf

    import ctl
    from bench.model_garden_zoo import data, variants
    from ctl.core import step_random
    from ctl.core.evaluation import stateful_random_ops
    from ctl.faults import resume

    resume.seed_everything(1)  # As the run: tf_keras' dropout draws from generators.
    task = ctl.ModelGardenTask(experiment=experiment, params_override=variants.overrides(
        experiment, STEPS) + data.data_overrides(experiment, os.path.join(workdir, "data")))
    model, optimizer = task.build_model(), task.build_optimizer()
    metrics = task.build_metrics(training=True)
    batch = next(iter(task.build_inputs(training=True)))
    global_step = tf.Variable(0, dtype=tf.int64)

    def train_step(inputs):  # As the run traces it (ctl.FaultTolerance.stateless_random_ops).
        with step_random.drawn_per_step(1, global_step):
            return task.train_step(inputs, model, optimizer, metrics)

    found = stateful_random_ops(tf.function(train_step).get_concrete_function(batch))
    command = f"python -m bench.model_garden_zoo.guarantees {experiment} --random_ops"
    if not found:
        return f"its train step holds no stateful random op ({command})"
    return (f"its train step draws from stateful random ops, {', '.join(found)}, not through the "
            f"tf.random functions ctl.FaultTolerance.stateless_random_ops replaces, whose state "
            f"lives in their kernels, in no checkpoint: a new process draws from their start "
            f"({command})")


GRADIENTS_CHECK = "GRADIENTS "
GRADIENT_CALLS = 5  # Calls of the gradient function in each of the check's processes.
# Processes of the check, two at a time: a model whose gradients come out one of two ways, the
# rarer in about one process of ten (DeepLab v3+ on this host: 3 of 25, 1 of 17 and 2 of 16),
# shows both ways in 24 with a chance of about 9 in 10 (in 12, about 7 in 10: 12 missed it once).
GRADIENT_PROCESSES = 24


class _RecordedGradients:
    """What Model Garden's `train_step` gets as its optimizer in the gradients check: it keeps
    the gradients the step applies (no update), so that only Model Garden's and TensorFlow's
    code computes them."""

    gradients = None

    def apply_gradients(self, grads_and_vars, **unused_kwargs):
        self.gradients = [gradient for gradient, _ in grads_and_vars]


def _digest(arrays) -> str:
    import hashlib

    import numpy as np

    digest = hashlib.sha1()
    for array in arrays:
        digest.update(np.asarray(array).tobytes())
    return digest.hexdigest()[:16]


def _gradients_once(experiment: str, workdir: str, path: str) -> str:
    """In this process: Model Garden's own `train_step` of the variant on its first train batch,
    from the seeded initial weights, `GRADIENT_CALLS` times (one `tf.function`); writes the first
    call's gradients to `path` (.npz); returns how many calls differ from the first, the
    variables' names and digests of the weights and the batch it started from (JSON)."""
    import numpy as np
    import tensorflow as tf

    import ctl
    from bench.model_garden_zoo import data, variants
    from ctl.faults import resume

    resume.seed_everything(1)  # Op determinism on, as in the run.
    task = ctl.ModelGardenTask(experiment=experiment, params_override=variants.overrides(
        experiment, STEPS) + data.data_overrides(experiment, os.path.join(workdir, "data")))
    garden, model = task.garden_task, task.build_model()
    batch = next(iter(task.build_inputs(training=True)))

    @tf.function
    def gradients(inputs):
        recorded = _RecordedGradients()
        garden.train_step(inputs, model=model, optimizer=recorded, metrics=None)
        return recorded.gradients

    calls = [[np.asarray(g) for g in gradients(batch) if g is not None] for _ in range(GRADIENT_CALLS)]
    np.savez(path, *calls[0])
    differ = [sum(a.tobytes() != b.tobytes() for a, b in zip(calls[0], c)) for c in calls[1:]]
    return json.dumps({"variables": len(calls[0]), "differ": differ,
                       "names": [v.name for v in model.trainable_variables],
                       "weights": _digest(w.numpy() for w in model.weights),
                       "batch": _digest(tf.nest.flatten(batch))})


def gradients_check(experiment: str, family: str, workdir: str,
                    processes: int = GRADIENT_PROCESSES) -> str:
    """Whether Model Garden's own train step of the variant (its model, losses and
    `tape.gradient`; no ctl loop, no update) gives the same gradients on the same batch and
    weights: `GRADIENT_CALLS` calls in one process, and the first call of `processes` processes,
    two side by side at a time (each `--gradients_once`, with this environment:
    `TF_NUM_INTEROP_THREADS` and `TF_ENABLE_ONEDNN_OPTS` too), each starting from the same
    weights and batch (their digests). A sentence.

    Args:
      experiment: a registered experiment's name.
      family: its family.
      workdir: the zoo's workdir (its `data/` holds the generated files).
      processes: how many processes compute the gradients.
    """
    import subprocess

    import numpy as np

    from bench.model_garden_zoo import data

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = [os.path.join(workdir, f"gradients-{experiment.replace('/', '_')}-{k}.npz")
             for k in range(processes)]
    data.data_overrides(experiment, os.path.join(workdir, "data"))  # Written once, before all.
    said = []
    for pair in range(0, processes, 2):  # Side by side, as the guarantee check runs its trainers.
        running = [subprocess.Popen(
            [sys.executable, "-m", "bench.model_garden_zoo.guarantees", experiment,
             f"--family={family}", f"--workdir={workdir}", f"--gradients_once={path}"],
            cwd=root, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "PYTHONPATH": root}) for path in paths[pair:pair + 2]]
        for process in running:
            out, _ = process.communicate(timeout=WAIT_S)
            lines = [line[len(GRADIENTS_CHECK):] for line in out.splitlines()
                     if line.startswith(GRADIENTS_CHECK)]
            if not lines:
                return f"the gradients check ended without a result (exit {process.returncode})"
            said.append(json.loads(lines[-1]))
    loaded = [np.load(p) for p in paths]
    grads = [[found[k] for k in sorted(found.files, key=lambda k: int(k.split("_")[1]))]
             for found in loaded]
    for path in paths:
        os.remove(path)
    return gradients_sentence(experiment, said, grads)


def gradients_sentence(experiment: str, said: List[Dict[str, Any]], grads: List[List[Any]]) -> str:
    """The gradients check's sentence from what its processes found.

    Args:
      experiment: the row's experiment.
      said: each process's `--gradients_once` record (JSON-decoded).
      grads: each process's gradients of its first call, in the model's order.
    """
    import numpy as np

    processes = len(grads)
    outcomes: Dict[str, List[int]] = {}
    for k, process_grads in enumerate(grads):
        outcomes.setdefault(_digest(process_grads), []).append(k)
    within = max(max(s["differ"], default=0) for s in said)
    settings = ", ".join(f"{name} {os.environ.get(name, 'unset')}"
                         for name in ("TF_NUM_INTEROP_THREADS", "TF_ENABLE_ONEDNN_OPTS"))
    variables = said[0]["variables"]
    command = f"python -m bench.model_garden_zoo.guarantees {experiment} --gradients"
    start = ("Model Garden's own train step (no ctl loop, no update), op determinism on, "
             f"{settings}, on one batch from the same weights: the gradients of {within} of "
             f"{variables} variables differ between {GRADIENT_CALLS} calls in one process")
    starts = {(s["weights"], s["batch"]) for s in said}
    if len(starts) > 1:
        return (f"{start}; but its {processes} processes did not start from the same weights and "
                f"batch ({len(starts)} different digests) ({command})")
    if len(outcomes) == 1:
        return f"{start}, and 0 between {processes} processes ({command})"
    ranked = sorted(outcomes.values(), key=len, reverse=True)
    usual, other = grads[ranked[0][0]], [grads[found[0]] for found in ranked[1:]]
    differ = sorted({i for g in other for i, (a, b) in enumerate(zip(usual, g))
                     if a.tobytes() != b.tobytes()})
    worst = max(float(np.abs(a.astype(np.float64) - b).max()) / max(float(np.abs(a).max()), 1e-30)
                for g in other for i, (a, b) in enumerate(zip(usual, g)) if i in differ)
    names = said[0]["names"]
    which = (f" (in the model's order {names[differ[0]]} to {names[differ[-1]]})"
             if len(names) == variables else "")
    return (f"{start}, but {processes} processes give {len(outcomes)} different sets "
            f"({', '.join(str(len(found)) for found in ranked)} processes): in the rarer, the "
            f"gradients of {len(differ)} variables{which} differ by up to {worst:.1g} relative. "
            f"{TENSORFLOW_PER_PROCESS} ({command})")


# What the gradients check shows where its processes disagree (guarantees_page reads it too).
TENSORFLOW_PER_PROCESS = (
    "So TensorFlow computes this model's gradients one of several ways, fixed within a process "
    "and not from one to the next, with no ctl code in the step: a resumed run, a new process, "
    "may end a few ulps away from the uninterrupted one")


COLLECTIVE_SHAPES = "Shape mismatch in the collective instance"
TRAIN_LIB_CHECK = "TRAIN-LIB-AT-2 "


def train_lib_at_two_replicas(row: _Row) -> str:
    """What Model Garden's own `train_lib` does with the row's variant at two CPU replicas, in
    loops of LOOP steps (a `tf.while_loop`), in a process of its own: a sentence for the row."""
    return _check_in_process(row, "--train_lib_at_two_replicas", TRAIN_LIB_CHECK,
                             "Model Garden's train_lib check")


def _train_lib_at_two_replicas(experiment: str, workdir: str) -> str:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from official.core import train_lib

    from bench.model_garden_zoo import compare
    from ctl.adapters import model_garden

    model_dir = os.path.join(workdir, "guarantees", experiment.replace("/", "_"), "train_lib_at_2")
    shutil.rmtree(model_dir, ignore_errors=True)
    params = model_garden.experiment_config(experiment, params_override=compare.params_for(
        experiment, 2 * LOOP, os.path.join(workdir, "data")) + [{"trainer": {
            "steps_per_loop": LOOP, "checkpoint_interval": 2 * LOOP, "summary_interval": LOOP}}])
    strategy, task, trainer = compare.train_py_setup(
        params, model_dir, strategy=tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
    what = (f"Model Garden's train_lib fails the same way (its {experiment} variant, "
            f"MirroredStrategy of 2 CPUs, loops of {LOOP} steps: python -m "
            f"bench.model_garden_zoo.guarantees {experiment} --train_lib_at_two_replicas)")
    try:
        train_lib.run_experiment(distribution_strategy=strategy, task=task, mode="train",
                                 params=params, model_dir=model_dir, trainer=trainer)
    except Exception as error:  # noqa: BLE001 (what it says is the finding)
        return what if COLLECTIVE_SHAPES in str(error) else (
            f"Model Garden's train_lib fails otherwise: {type(error).__name__}: "
            f"{compare._message(error)[:200]}")  # noqa: SLF001
    return "Model Garden's train_lib trains there (loops of %d steps at two replicas)" % LOOP


INPUT_CHECK = "INPUT-AT-2 "
# The augmentations Model Garden's readers apply to a batch once it is batched (at two replicas to
# each replica's half batch), by their `task.train_data` field: the value that turns one off, what
# it is, and what it does to the examples.
BATCH_AUGMENTATIONS = {
    "mixup_and_cutmix": (None, "its mixup and cutmix", "mixed"),
    "masking_rate": (0.0, "its masking of tokens", "masked"),
}


def input_at_two_replicas(row: _Row) -> str:
    """What Model Garden's own pipeline gives the row's steps at one replica and at two, in a
    process of its own: a sentence for the row."""
    return _check_in_process(row, "--input_at_two_replicas", INPUT_CHECK, "the input check")


def global_batch_sums(experiment: str, overrides, replicas: int) -> List[float]:
    """The sum of the inputs of each global batch of steps 1..STEPS (as the recorded task adds
    them: each numeric tensor in float64) that Model Garden's own `task.build_inputs` gives at
    `replicas` replicas: `replicas` consecutive batches a step of one input pipeline built for an
    `InputContext` of that many replicas, as a MirroredStrategy hands them out. Seeded as the run
    seeds (`ctl.FaultTolerance.seed = 1`) before the build; no ctl loop.

    Args:
      experiment: a registered experiment's name.
      overrides: its params_override (the variant, the data, any more).
      replicas: replicas in sync.
    """
    import numpy as np
    import tensorflow as tf

    import ctl
    from ctl.faults import resume

    resume.seed_everything(1)
    task = ctl.ModelGardenTask(experiment=experiment, params_override=overrides)
    context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                         num_replicas_in_sync=replicas)
    batches = iter(task.garden_task.build_inputs(task.params.task.train_data, input_context=context))
    sums = []
    for _ in range(STEPS):
        tensors = [t for _ in range(replicas) for t in tf.nest.flatten(next(batches))]
        sums.append(sum(float(np.sum(np.asarray(t, np.float64))) for t in tensors
                        if t.dtype.is_floating or t.dtype.is_integer))
    return sums


def first_other_step(a: List[float], b: List[float], first: int = HOLD_AT + 1) -> Optional[int]:
    """The first of steps `first`..STEPS whose sums in `a` and `b` (step k at index k-1) differ
    beyond INPUT_TOLERANCE, or None.

    Args:
      a, b: the sums of two builds (`global_batch_sums`).
      first: the first step compared (default: the first the row runs at two replicas).
    """
    for step in range(first, STEPS + 1):
        if _relative(a[step - 1], b[step - 1]) > INPUT_TOLERANCE:
            return step
    return None


def _input_at_two_replicas(experiment: str, workdir: str, more=()) -> str:
    """`--input_at_two_replicas`, in this process: the global batches of the variant's steps
    HOLD_AT+1..STEPS at one replica and at two (`global_batch_sums`); where they differ, again
    with the first augmentation of `BATCH_AUGMENTATIONS` that is on turned off; and whether a
    second build at one replica gives the first's at every step. A sentence.

    Args:
      experiment: a registered experiment's name.
      workdir: the zoo's workdir (its `data/` holds the generated files).
      more: params_override dicts applied after the variant's (a test's).
    """
    from bench.model_garden_zoo import data, variants
    from ctl.adapters import model_garden

    base = variants.overrides(experiment, STEPS) + data.data_overrides(
        experiment, os.path.join(workdir, "data")) + list(more)
    one, two, again = (global_batch_sums(experiment, base, r) for r in (1, 2, 1))
    steps = f"steps {HOLD_AT + 1}-{STEPS}"
    said = ("Model Garden's own pipeline (its task.build_inputs, no ctl loop, seeded as the run; "
            "at two replicas two consecutive half batches a step, of an InputContext of 2 replicas)")
    other = first_other_step(one, two)
    if other is None:
        said += (f" gives the same global batches at one and two replicas at {steps} (the sums of "
                 "their inputs): the run at two replicas read other data than its pipeline gives")
    else:
        said += (f" gives other global batches at two replicas than at one: step {other}'s inputs "
                 f"sum to {two[other - 1]!r} at two, {one[other - 1]!r} at one")
        train_data = model_garden.experiment_config(experiment, params_override=base).task.train_data
        found = [(field, *how) for field, how in BATCH_AUGMENTATIONS.items()
                 if hasattr(train_data, field) and getattr(train_data, field) not in (None, how[0])]
        for field, off, name, done in found[:1]:
            without = base + [{"task": {"train_data": {field: off}}}]
            one_off, two_off = (global_batch_sums(experiment, without, r) for r in (1, 2))
            still = first_other_step(one_off, two_off)
            said += (f"; with task.train_data.{field}={off!r} (turning off {name}, applied to "
                     "each batch after batching) " + (
                         f"they are the same at {steps}: the same examples, {done} as one batch at "
                         "one replica and as two half batches at two" if still is None else
                         f"they still differ: step {still}'s inputs sum to {two_off[still - 1]!r} "
                         f"at two, {one_off[still - 1]!r} at one"))
        if not found:
            said += ("; none of the augmentations applied to each batch that the check turns off "
                     f"is on ({', '.join('task.train_data.' + f for f in BATCH_AUGMENTATIONS)})")
    unstable = first_other_step(one, again, first=1)
    if unstable is not None:
        said += (f"; two builds at one replica already differ at step {unstable} "
                 f"({one[unstable - 1]!r} vs {again[unstable - 1]!r}): the pipeline does not "
                 "repeat itself")
    return said + f" (python -m bench.model_garden_zoo.guarantees {experiment} --input_at_two_replicas)"


def _new_replicas(row: _Row) -> Dict[str, Any]:
    from tests.support.reading import scalars

    model_dir, steps = row.path("replicas"), row.path("replicas.steps")
    shutil.copytree(model_dir, model_dir + "-stopped")  # For a second try (below).
    flags = ["--strategy=mirrored", "--cpu_replicas=2"]
    note = ""
    with row.trainer("train", model_dir, steps, *flags) as run:
        try:
            _finished(run, "the run at two replicas:")
        except Failed:
            if COLLECTIVE_SHAPES not in run.stdout() + run.stderr():
                raise
            # TensorFlow's gather of sparse gradients (embedding tables) of other sizes on
            # each replica, inside a tf.while_loop: is it Model Garden's own? Its train_lib, in
            # loops of LOOP steps at two replicas; and ctl again in a host loop.
            note = (f"in a tf.while_loop at two replicas TensorFlow's collective gather fails "
                    f"({COLLECTIVE_SHAPES}: the sparse gradients of other sizes on each replica); "
                    f"{train_lib_at_two_replicas(row)}; so run with "
                    "ctl.Trainer.use_tf_while_loop=False, as here")
    if note:
        shutil.rmtree(model_dir)
        shutil.copytree(model_dir + "-stopped", model_dir)
        for name in (steps, steps + ".inputs"):
            if os.path.exists(name):
                os.remove(name)
        flags.append("--gin_bindings=ctl.Trainer.use_tf_while_loop=False")
        with row.trainer("train", model_dir, steps, *flags) as run:
            _finished(run, "the run at two replicas in a host loop:")
    said = [line for line in (run.stderr() + run.stdout()).splitlines()
            if "replica" in line and "warning" in line.lower()]
    ran = sorted({s for s, _ in read_losses(steps)})
    if ran != list(range(HOLD_AT + 1, STEPS + 1)):
        raise Failed(f"at two replicas the run went on with steps {ran}, not {HOLD_AT + 1}-{STEPS}")
    final, reference = _latest(model_dir), _latest(row.reference)
    if _step(final) != STEPS:
        raise Failed(f"at two replicas the run ended at checkpoint {_step(final)}")
    miscounted, counted = counted_examples(
        train_examples(final), train_examples(reference),
        read_input_examples(row.path("reference.steps") + ".inputs"),
        read_input_examples(steps + ".inputs"))
    if miscounted:
        raise Failed(miscounted)
    # What each step read: the sum of its inputs (both replicas'), the uninterrupted run's.
    read = {p: read_input_sums(p + ".inputs") for p in (steps, row.path("reference.steps"))}
    for step in range(HOLD_AT + 1, STEPS + 1):
        ours, theirs = read[steps].get(step), read[row.path("reference.steps")].get(step)
        if ours is None or theirs is None or _relative(ours, theirs) > INPUT_TOLERANCE:
            raise Failed(f"at two replicas step {step} read other data than uninterrupted "
                         f"(the sum of its inputs {ours!r} vs {theirs!r}); "
                         f"{input_at_two_replicas(row)}")
    ours, theirs = (scalars(os.path.join(d, "train")).get("loss", {}) for d in (model_dir, row.reference))
    if STEPS not in ours or STEPS not in theirs:
        raise Failed(f"no loss summary at step {STEPS}: {sorted(ours)} at two replicas, "
                     f"{sorted(theirs)} uninterrupted")
    loss_diff = _relative(ours[STEPS], theirs[STEPS])
    # Each step's loss on each replica (the recorded task's lines) against the step's loss at
    # one replica: a model whose replica loss is its share of the global batch's (summed over
    # the replicas, as Model Garden's ranking models' is) reports half at two replicas, in ctl's
    # summaries (their mean) as in train_lib's.
    per_replica: Dict[int, List[float]] = {}
    for step, bits in read_losses(steps):
        per_replica.setdefault(step, []).append(_bits_to_float(bits))
    sums = max(_relative(sum(v), _bits_to_float(row.losses[s])) for s, v in per_replica.items())
    if sums < loss_diff and sums <= REPLICA_TOLERANCE:
        loss_diff = sums
        share = ("; the summaries' loss is the replicas' mean, and this model's replica loss is "
                 "its share of the global batch's: the replicas' losses add up to the one "
                 f"replica's, every step within {sums:.1g}")
    else:
        share = ""
    # The run's records differ by design (the input position, the examples since the new size).
    _, weights_diff = checkpoint_difference(final, reference, tolerance=math.inf,
                                            ignore=("train_input", "train_examples", "rng"))
    beyond = max(loss_diff, weights_diff) > REPLICA_TOLERANCE
    # The states of the generators tf_keras' random ops (dropout) draw from, in the checkpoint.
    draws, _ = checkpoint_difference(final, reference, ignore=("model", "optimizer", "train_",
                                                               "global_step"))
    return {"holds": True, "max_rel_loss_diff": loss_diff, "max_rel_weight_diff": weights_diff,
            "beyond_reduction_order": beyond or bool(note), "warned": bool(said), "detail": (
                (note + "; then: " if note else "") +
                f"from ckpt-{HOLD_AT} of one replica, steps {HOLD_AT + 1}-{STEPS} at two, each "
                f"reading the uninterrupted run's data (its inputs' sum), {counted}; "
                f"the loss differs by {loss_diff:.1g}{share}, the "
                f"weights by up to {weights_diff:.1g} (relative)" + (
                    f": more than {REPLICA_TOLERANCE:g}, so more than a reduction order's, on the "
                    "same data: " + (
                        "the model's random ops drew other numbers at two replicas (its generators' "
                        f"states in the checkpoint differ: {draws.split(':')[0]})" if draws else
                        "the model computes otherwise at two replicas (which op is not checked)")
                    if beyond else ": the reduction order"))}


def check(experiment: str, family: str, workdir: str) -> Dict[str, Dict[str, Any]]:
    """The four columns of `experiment`'s row.

    Args:
      experiment: a registered experiment's name.
      family: its family (registry.family).
      workdir: the zoo's workdir (its `data/` holds the generated files).
    """
    try:
        for module in _family_modules(family):  # Registers the experiment (as the gin file does).
            importlib.import_module(module)
        row = _Row(experiment, family, workdir)
    except Exception as error:  # noqa: BLE001 (the row says why)
        traceback.print_exc()
        line = f"building the run's config: {type(error).__name__}: {str(error).splitlines()[0][:300]}"
        return {c: {"holds": None, "detail": line} for c in COLUMNS}
    try:
        out = reference_and_kill_9(row)
    except Failed as failed:  # The uninterrupted run failed: nothing to compare with.
        return {c: {"holds": None, "detail": f"not run: {failed}"} for c in COLUMNS}
    out.update(sigterm_and_new_replicas(row))
    settings = cpu_settings()
    if settings:  # What a user reading the row must set too.
        for column in out.values():
            column["detail"] += f" (its processes started with {settings})"
    return out


def cpu_settings() -> str:
    """The environment that makes TensorFlow's CPU kernels run one op at a time and without
    oneDNN (`ctl.faults.resume.cpu_left_to_chance`), as set for this process, or ""."""
    names = ("TF_NUM_INTEROP_THREADS", "TF_ENABLE_ONEDNN_OPTS")
    return " ".join(f"{name}={os.environ[name]}" for name in names if name in os.environ)


def run_in_process(experiment: str, family: str, workdir: str, log_dir: str,
                   env: Dict[str, str], timeout_s: int) -> Dict[str, Any]:
    """`check` in a process of its own (its output in `log_dir`): the row's `guarantees`.

    Args:
      experiment: a registered experiment's name.
      family: its family.
      workdir: the zoo's workdir.
      log_dir: where the process's log goes (NAME-guarantees.log).
      env: the process's environment.
      timeout_s: how long it may take.
    """
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    log = _log(log_dir, experiment)
    command = [sys.executable, "-m", "bench.model_garden_zoo.guarantees", experiment,
               f"--family={family}", f"--workdir={workdir}"]
    with open(log, "w") as out:
        try:
            subprocess.run(command, cwd=root, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s,
                           env=env, check=False, start_new_session=True)
        except subprocess.TimeoutExpired:
            pass
    ended = _ended(log)
    if ended is not None:
        return ended
    with open(log) as f:
        lines = f.read().splitlines()
    last = [line for line in lines if line.strip()][-1:] or ["no output"]
    return {c: {"holds": None, "detail": f"the check ended without a result: {last[0][:300]}"}
            for c in COLUMNS}


def kept_row(path: str, experiment: str, family: str) -> Dict[str, Any]:
    """`experiment`'s row as the results file at `path` has it (for `--guarantees=only`).

    Args:
      path: the zoo's results file.
      experiment: the row's experiment.
      family: its family (for a row the file does not have).
    """
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            rows = [r for r in json.load(f).get("rows", []) if r["experiment"] == experiment]
    if rows:
        return dict(rows[0])
    keys = ("trains", "same_loss", "max_rel_loss_diff", "same_eval", "ctl_s_per_step",
            "train_lib_s_per_step")
    return {"experiment": experiment, "family": family, **{k: None for k in keys},
            "reason": "the trainers' comparison was not run"}


def row_columns(columns: Dict[str, Any], commit: str) -> Dict[str, Any]:
    """What `check`'s process found, as the row's keys.

    Args:
      columns: its `ZOO-GUARANTEES` record.
      commit: the commit it ran at.
    """
    return {"guarantees": {c: columns[c] for c in COLUMNS}, "guarantees_commit": commit,
            "guarantees_cpu_s": columns.get("cpu_s"), "guarantees_wall_s": columns.get("wall_s")}


def _log(log_dir: str, experiment: str) -> str:
    return os.path.join(log_dir, experiment.replace("/", "_") + "-guarantees.log")


def _ended(log: str) -> Optional[Dict[str, Any]]:
    """The `ZOO-GUARANTEES` record of a row's log, if its check ended."""
    if not os.path.exists(log):
        return None
    with open(log) as f:
        found = [json.loads(line[len("ZOO-GUARANTEES "):]) for line in f
                 if line.startswith("ZOO-GUARANTEES ")]
    return found[-1] if found else None


def record_run(path: str, workdir: str, rows: int, registered: int) -> None:
    """Writes into the results file at `path` what the guarantee run in `workdir` was: its commit,
    rows at once, start, wall minutes to its last row's end, the host's load, and how many rows
    ended (`guarantees_run`).

    Args:
      path: the zoo's results file.
      workdir: the run's workdir (its run file, loads and logs).
      rows: the rows the run was asked for.
      registered: the experiments registered.
    """
    from bench.model_garden_zoo.__main__ import LOADS_FILE, RUN_FILE

    with open(os.path.join(workdir, RUN_FILE)) as f:
        run = json.load(f)
    loads_file = os.path.join(workdir, LOADS_FILE)
    loads = []
    if os.path.exists(loads_file):
        with open(loads_file) as f:
            loads = [float(line) for line in f if line.strip()]
    logs = [os.path.join(workdir, "logs", n) for n in os.listdir(os.path.join(workdir, "logs"))
            if n.endswith("-guarantees.log")]
    ended = [log for log in logs if _ended(log) is not None]
    last = max((os.path.getmtime(log) for log in ended), default=run["started"])
    with open(path) as f:
        results = json.load(f)
    results["guarantees_run"] = {
        "commit": run.get("commit"), "jobs": run.get("jobs"), "rows_asked": rows,
        "rows_ended": len(ended), "registered": registered,
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(run["started"])),
        "minutes": round((last - run["started"]) / 60, 1),
        "load_1min": {"min": min(loads), "max": max(loads),
                      "mean": round(sum(loads) / len(loads), 1)} if loads else None}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1)
    os.replace(tmp, path)


def collect(workdir: str, families: Dict[str, str], path: str) -> int:
    """`--collect=WORKDIR --guarantees=only`: the guarantee columns of each row whose check ended
    in the run in `workdir` (stopped or still running), written into the rows of the results
    file at `path`; the rows not reached keep what they had.

    Args:
      workdir: the run's workdir.
      families: the registered experiments and their families.
      path: the zoo's results file.
    """
    from bench.model_garden_zoo.__main__ import RUN_FILE

    with open(os.path.join(workdir, RUN_FILE)) as f:
        commit = json.load(f).get("commit") or "unknown"
    with open(path) as f:
        results = json.load(f)
    found = {name: _ended(_log(os.path.join(workdir, "logs"), name)) for name in families}
    for row in results["rows"]:
        columns = found.get(row["experiment"])
        if columns is not None:
            row.pop("guarantees_note", None)
            row.update(row_columns(columns, commit))
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1)
    os.replace(tmp, path)
    with open(os.path.join(workdir, RUN_FILE)) as f:
        asked = json.load(f).get("rows", len(families))
    record_run(path, workdir, asked, len(families))
    ended = sum(1 for v in found.values() if v is not None)
    print(f"results: {path} (guarantee columns of {ended} rows from {workdir})", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment")
    parser.add_argument("--family", default="", help="the experiment's family (default: registry.family)")
    parser.add_argument("--workdir", default="", help="data and model dirs (default: a temp dir)")
    parser.add_argument("--random_ops", action="store_true",
                        help="only: the stateful random ops in the variant's train step")
    parser.add_argument("--train_lib_at_two_replicas", action="store_true",
                        help="only: Model Garden's train_lib on the variant at two CPU replicas")
    parser.add_argument("--input_at_two_replicas", action="store_true",
                        help="only: Model Garden's own train pipeline of the variant at one "
                             "replica and at two, with its batch-level augmentation and without")
    parser.add_argument("--gradients", action="store_true",
                        help="only: do Model Garden's own train-step gradients repeat, in one "
                             f"process and across {GRADIENT_PROCESSES} (gradients_check)")
    parser.add_argument("--gradients_once", default="",
                        help="(the gradients check's own processes) write them to this .npz")
    args = parser.parse_args(argv)
    if not args.family:
        from bench.model_garden_zoo import registry

        registry.import_all()
        args.family = registry.family(args.experiment)
    if not args.workdir:
        import tempfile

        args.workdir = tempfile.mkdtemp(prefix="model_garden_guarantees-")
    if args.random_ops:
        for module in _family_modules(args.family):
            importlib.import_module(module)
        print(RANDOM_OPS_CHECK + _stateful_random_ops(args.experiment, args.workdir), flush=True)
        return 0
    if args.gradients_once:
        for module in _family_modules(args.family):
            importlib.import_module(module)
        print(GRADIENTS_CHECK + _gradients_once(args.experiment, args.workdir, args.gradients_once),
              flush=True)
        return 0
    if args.gradients:
        for module in _family_modules(args.family):  # The data's overrides name the experiment.
            importlib.import_module(module)
        print(GRADIENTS_CHECK + gradients_check(args.experiment, args.family, args.workdir), flush=True)
        return 0
    if args.input_at_two_replicas:
        for module in _family_modules(args.family):
            importlib.import_module(module)
        print(INPUT_CHECK + _input_at_two_replicas(args.experiment, args.workdir), flush=True)
        return 0
    if args.train_lib_at_two_replicas:
        for module in _family_modules(args.family):
            importlib.import_module(module)
        print(TRAIN_LIB_CHECK + _train_lib_at_two_replicas(args.experiment, args.workdir), flush=True)
        return 0
    start = time.perf_counter()
    columns = check(args.experiment, args.family, args.workdir)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # The row's ctl.run processes.
    columns["cpu_s"] = round(usage.ru_utime + usage.ru_stime, 1)
    columns["wall_s"] = round(time.perf_counter() - start, 1)
    print("ZOO-GUARANTEES " + json.dumps(columns), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
