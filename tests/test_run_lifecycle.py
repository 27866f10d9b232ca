"""A run's life through `python -m ctl.run`: how it starts, stops, resumes, ends and is run again.

Real processes on real model dirs (a run that restarts one, or trains beside a sidecar's: the
command's main in this process, `tests/support/in_process.py`). `tests/lifecycle.gin`'s `PacedTask` takes
real time per step, so that a signal sent when its progress file shows a
step lands where the test means it to. Every wait is bounded and every
process is killed in a `finally`.
"""

import json
import os
import shutil
import signal
import sys

import pytest
import tensorflow as tf

from ctl.core.stop import EXIT_PREEMPTED
from tests.support.env import ROOT, TEST_GIN
from tests.support.in_process import ctl_in_process
from tests.support.processes import Process, run, run_ctl
from tests.support.reading import ctl_stderr_lines

LIFECYCLE_GIN = os.path.join(ROOT, "tests", "lifecycle.gin")


def progress_steps(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [int(line) for line in f.read().split() if line.isdigit()]


def eval_steps(model_dir):
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [r["step"] for r in records if r["kind"] == "eval"]


def lifecycle_args(model_dir, progress, *bindings, mode="train_and_eval"):
    return [f"--mode={mode}", f"--model_dir={model_dir}", f"--gin_file={LIFECYCLE_GIN}",
            f"--gin_bindings=PacedTask.progress_file='{progress}'",
            *(f"--gin_bindings={b}" for b in bindings)]


@pytest.mark.slow
def test_evaluations_stay_on_multiples_of_eval_interval_when_preempted_more_often(tmp_path):
    """eval_interval 20 of 40 steps; each process is stopped about 14 steps after it
    starts: still an evaluation at 20 and at 40, and nowhere else."""
    model_dir, progress = str(tmp_path / "run"), str(tmp_path / "progress")
    stops = []
    for _ in range(6):
        start = max(progress_steps(progress), default=0)
        with Process.ctl(*lifecycle_args(model_dir, progress)) as run:
            if run.wait_until(lambda: max(progress_steps(progress), default=0) >= start + 14):
                run.proc.send_signal(signal.SIGTERM)
            code = run.finish().returncode
        if code == 0:
            break
        assert code == EXIT_PREEMPTED, run.stderr()
        stops.append(max(progress_steps(progress)))
    assert code == 0, run.stderr()
    assert len(stops) >= 2 and all(b - a < 20 for a, b in zip([0] + stops, stops)), stops
    assert eval_steps(model_dir) == [20, 40], stops


def _files_and_times(directory):
    found = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, directory)] = (f.read(), os.stat(path).st_mtime_ns)
    return found


@pytest.mark.slow
def test_a_finished_run_says_where_its_results_are_and_run_again_changes_nothing(tmp_path):
    model_dir = str(tmp_path / "run")
    careless = str(tmp_path / "careless.txt")
    args = ["--mode=train_and_eval", f"--model_dir={model_dir}", f"--gin_file={TEST_GIN}",
            "--gin_bindings=import tests.lifecycle_tasks",
            "--gin_bindings=ctl.Experiment.hooks=[@ctl.hooks.BestCheckpoint(), @CarelessHook()]",
            f"--gin_bindings=CarelessHook.path='{careless}'"]
    first = run_ctl(*args)
    assert first.returncode == 0, first.stderr
    # The process ends without the interpreter's teardown (ctl.utils.process_end), after
    # the exit handlers and with the files a hook left open flushed.
    assert open(careless).read() == "written, never closed\n"
    assert open(careless + ".atexit").read() == "ran\n"
    done = [line for line in first.stdout.splitlines() if line.startswith(" done |")]
    assert 3 <= len(done) <= 5, first.stdout
    text = "\n".join(done)
    assert "trained to step 20; final eval: loss: " in done[0]
    assert "best: loss = " in text and os.path.join(model_dir, "best", "ckpt-") in text
    assert f"python -m ctl.report --model_dir={model_dir}" in text
    assert f"tensorboard --logdir {model_dir}" in text
    assert "latest ckpt-20" in text and "summaries train/ eval/" in text
    before = _files_and_times(model_dir)

    # Run again, then longer: the command's main in this process (the process's own end: above).
    again = ctl_in_process(*args)
    assert again.returncode == 0, again.stderr
    assert not ctl_stderr_lines(again.stderr), again.stderr
    assert "the run is already complete (trained to step 20" in again.stdout
    assert f"python -m ctl.report --model_dir={model_dir}" in again.stdout
    assert " eval |" not in again.stdout and " ckpt | step:     20 | restored" in again.stdout
    # Nothing written, not even the same bytes, but the lock's record of its last holder.
    after = _files_and_times(model_dir)
    after.pop("trainer.lock")
    before.pop("trainer.lock")
    assert after == before
    assert eval_steps(model_dir) == [10, 20]

    longer = ctl_in_process(*args, "--gin_bindings=ctl.Schedule.train_steps=30")
    assert longer.returncode == 0, longer.stderr
    assert eval_steps(model_dir) == [10, 20, 30]
    assert "trained to step 30" in longer.stdout


@pytest.mark.slow  # Starts a Python process (tests/support/tiers.py).
def test_a_hooks_last_write_to_a_bucket_survives_the_fast_exit(gcs_dir, tmp_path):
    """A hook leaves a `tf.io.gfile.GFile` on gs:// open at the run's end: the fast exit
    (ctl.utils.process_end) closes it, so its write reaches the bucket (the GCS emulator)."""
    careless = f"{gcs_dir}/careless.txt"
    run = run_ctl("--mode=train", f"--model_dir={tmp_path / 'run'}", f"--gin_file={TEST_GIN}",
                  "--gin_bindings=import tests.lifecycle_tasks",
                  "--gin_bindings=ctl.Experiment.hooks=[@CarelessHook()]",
                  f"--gin_bindings=CarelessHook.path='{careless}'",
                  "--gin_bindings=ctl.Schedule.train_steps=10")
    assert run.returncode == 0, run.stderr
    assert tf.io.gfile.GFile(careless + ".atexit").read() == "ran\n"
    assert tf.io.gfile.exists(careless), "the hook's last write was lost"
    assert tf.io.gfile.GFile(careless).read() == "written, never closed\n"


def test_the_fast_exit_keeps_mains_status_and_closes_open_gfile_writers(tmp_path, monkeypatch):
    """`ctl.utils.process_end`'s pieces in this process (the test above: a command's end)."""
    from ctl.utils import process_end

    monkeypatch.setattr(process_end, "_status", None)  # Never registered here: nothing ends this process.
    for main, status in ((lambda: sys.exit(3), 3), (lambda: sys.exit("a message"), 1), (lambda: None, 0)):
        try:
            process_end.run(main)
        except SystemExit:
            pass
        assert process_end._status == status
    written, read = tmp_path / "written", tmp_path / "read"
    read.write_text("kept\n")
    writer, reader = tf.io.gfile.GFile(str(written), "w"), tf.io.gfile.GFile(str(read), "r")
    writer.write("written, never closed\n")
    assert reader.read(2) == "ke"
    assert written.read_text() == ""  # Buffered until the file is closed.
    found = process_end._live_objects((tf.io.gfile.GFile,))
    assert any(f is writer for f in found) and any(f is reader for f in found)
    process_end._close_gfile_writers(tf, [writer, reader])
    assert written.read_text() == "written, never closed\n"
    assert reader.read() == "pt\n"  # A reader is left open, where it was.
    reader.close()


@pytest.mark.slow
def test_sigterm_during_the_final_evaluation_stops_it_and_a_restart_finishes_it(tmp_path):
    model_dir, progress = str(tmp_path / "run"), str(tmp_path / "progress")
    args = lifecycle_args(
        model_dir, progress, "ctl.Schedule.train_steps=10", "ctl.Schedule.eval_interval=None",
        "PacedTask.eval_seconds=0.3", "PacedTask.eval_examples=80")  # 10 batches: 3 s.

    def evaluating():
        with open(progress) as f:
            return "eval" in f.read().split()
    with Process.ctl(*args) as run:
        assert run.wait_until(lambda: os.path.exists(progress) and evaluating()), run.stderr()
        run.proc.send_signal(signal.SIGTERM)
        code = run.finish().returncode
    assert code == EXIT_PREEMPTED, run.stderr()
    lines = ctl_stderr_lines(run.stderr())
    assert len(lines) == 1 and lines[0].startswith("ctl.run: preempted: stopped by SIGTERM"), lines
    assert eval_steps(model_dir) == []
    assert not os.path.exists(os.path.join(model_dir, "ctl_run_finished.json"))
    again = ctl_in_process(*args)  # The restart: the command's main in this process.
    assert again.returncode == 0, again.stderr
    assert eval_steps(model_dir) == [10]  # Evaluated first, on restart at step 10.
    assert " done | step:     10 | trained to step 10" in again.stdout


@pytest.mark.parametrize("moment", ["waiting for config.gin", "between checkpoints"])
@pytest.mark.slow
def test_ctrl_c_on_a_waiting_sidecar_is_a_clean_stop(tmp_path, moment, trained_dir):
    model_dir = str(tmp_path / "run")
    waiting_for = "config.gin"
    if moment == "between checkpoints":
        shutil.copytree(trained_dir(), model_dir)
        os.remove(os.path.join(model_dir, "ctl_run_finished.json"))  # The trainer goes on.
        waiting_for = "waiting for a new checkpoint"
    else:
        os.makedirs(model_dir)
    with Process.ctl("--mode=continuous_eval", f"--model_dir={model_dir}") as run:
        run.wait_for_output(waiting_for, timeout=120)
        run.proc.send_signal(signal.SIGINT)
        code = run.finish(timeout=60).returncode
    assert code == EXIT_PREEMPTED, run.stderr()
    lines = ctl_stderr_lines(run.stderr())
    assert len(lines) == 1 and lines[0].startswith("ctl.run: stopped: SIGINT stopped the "
                                                   "evaluator"), run.stderr()
    assert "Traceback" not in run.stdout() + run.stderr()


# `--help`, a flag mistake and a gin mistake in the text are answered before TensorFlow is
# imported: `-X importtime` lists every module the process imported.
FAST_ANSWERS = {
    "--help": (["--help"], ""),
    "no --model_dir": (["--mode=train"], "needs --model_dir"),
    "bad --mode": (["--mode=trian", "--model_dir=DIR"], "value should be one of"),
    "gin name typo": (["--mode=train", "--model_dir=DIR", f"--gin_file={TEST_GIN}",
                       "--gin.ctl.Shedule.train_steps=3"], "Did you mean ctl.Schedule?"),
    "gin syntax error": (["--mode=train", "--model_dir=DIR", f"--gin_file={TEST_GIN}",
                          "--gin_bindings=ctl.Schedule.train_steps = = 3"], "cannot parse gin"),
    "gin bracket left open": (["--mode=train", "--model_dir=DIR",
                               "--gin_bindings=ctl.Schedule.train_steps = (3"], "cannot parse gin"),
    "missing gin file": (["--mode=train", "--model_dir=DIR", "--gin_file=nowhere.gin"],
                         "does not exist"),
}


@pytest.mark.parametrize("case", sorted(FAST_ANSWERS))
@pytest.mark.slow  # Starts a Python process (tests/support/tiers.py).
def test_help_and_flag_and_gin_text_errors_come_before_tensorflow_is_imported(case, tmp_path):
    args, expected = FAST_ANSWERS[case]
    model_dir = str(tmp_path / "run")
    args = [a.replace("DIR", model_dir) for a in args]
    result = run([sys.executable, "-X", "importtime", "-m", "ctl.run", *args], timeout=120)
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:")}
    assert "absl.flags" in imported  # -X importtime did report.
    assert "tensorflow" not in imported
    if case == "--help":
        assert "--model_dir" in result.stdout + result.stderr
        return
    said = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    assert result.returncode == 2 and len(said) == 1 and expected in said[0], result.stderr
    assert not os.path.exists(model_dir)


def _loss_points(summary_dir):
    """(step, file) of every `loss` scalar in the event files of `summary_dir` (repeats kept)."""
    import tensorflow as tf

    points = []
    for name in sorted(os.listdir(summary_dir)):
        if name.startswith("events.out.tfevents."):
            for event in tf.compat.v1.train.summary_iterator(os.path.join(summary_dir, name)):
                points += [(event.step, name) for v in event.summary.value if v.tag == "loss"]
    return points


@pytest.mark.slow
def test_in_line_evaluation_steps_aside_while_a_sidecar_serves_the_model_dir(tmp_path):
    model_dir, progress = str(tmp_path / "run"), str(tmp_path / "progress")
    announcement = os.path.join(model_dir, "evaluator.lock")  # The sidecar holds the role.
    args = lifecycle_args(model_dir, progress, "PacedTask.train_seconds=0.02",
                          "ctl.Schedule.max_checkpoints=10")  # The sidecar sees all 8.
    with Process.ctl(*(a.replace("train_and_eval", "continuous_eval") for a in args),
                    "--gin_bindings=ctl.ContinuousEval.timeout=300") as sidecar:
        assert sidecar.wait_until(lambda: os.path.exists(announcement)), sidecar.stderr()
        trainer = ctl_in_process(*args)  # The command's main in this process, beside the sidecar's.
        assert trainer.returncode == 0, trainer.stderr
        assert sidecar.finish(timeout=300).returncode == 0, sidecar.stderr()
    aside = [line for line in trainer.stdout.splitlines() if "in-line evaluation steps aside" in line]
    assert len(aside) == 1 and "a sidecar evaluator (pid" in aside[0], trainer.stdout
    assert eval_steps(model_dir) == []  # No in-line evaluation.
    points = _loss_points(os.path.join(model_dir, "eval"))
    assert sorted(step for step, _ in points) == list(range(5, 45, 5))  # Each once: the sidecar's.
    assert len({name for _, name in points}) == 1
    assert not os.path.exists(announcement)  # Gone with the sidecar.
