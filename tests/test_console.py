"""The console: one format, no library INFO lines, a live bar on a terminal, plain lines in a file."""

import io
import logging
import os
import re
import signal
import subprocess

import pytest

from ctl.utils import console
from tests.support.env import ctl_env, ROOT, TEST_GIN
from tests.support.processes import Process, ctl_command
from tests.support.reading import ctl_stderr_lines

# `kind | message` or `kind | step: N[/T] | message`: the one format.
ONE_FORMAT = re.compile(r"^ *[a-z]+(: warning)? \| ")
ABSL_PREFIX = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d")
MAIN_JOB = ("--mode=train_and_eval", f"--gin_file={TEST_GIN}",
            "--gin_bindings=ctl.Schedule.train_steps=60",
            "--gin_bindings=ctl.Schedule.eval_interval=30")


class Terminal(io.StringIO):
    def isatty(self):
        return True


def emit_loops(handler, steps, target, seconds_per_loop, clock):
    """Logs a train line per loop of 10 steps, through `handler` only."""
    logger = console.LOGGER
    propagate, logger.propagate = logger.propagate, False
    logger.addHandler(handler)
    try:
        lines = console.TrainLines(clock=lambda: clock[0])
        for step in steps:
            clock[0] += seconds_per_loop
            lines.loop_end(step, target, {"loss": 0.5}, 10, seconds_per_loop,
                           last=step == steps[-1])
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def test_pace_leaves_out_the_first_loop_after_a_restart():
    pace = console.Pace()
    assert pace.add(100, 5.0) is None  # Tracing: no rate yet.
    assert pace.add(100, 1.0) == 100.0
    assert pace.add(100, 3.0) == 50.0
    pace.restart()
    assert pace.add(100, 9.0) is None


def test_plain_train_lines_first_last_and_at_most_once_a_second():
    clock = [0.0]
    stream = io.StringIO()
    handler = console.Console(stream, bar=False, clock=lambda: clock[0])
    emit_loops(handler, [10, 20, 30, 40, 50, 60], 60, 0.4, clock)
    lines = stream.getvalue().splitlines()
    # First (10, tracing), due after a second (30: 0.8 s after 10 is not, 1.2 s is), last (60).
    assert [int(re.search(r"step: +(\d+)/60", line).group(1)) for line in lines] == [10, 40, 60]
    assert lines[0] == ("train | step:     10/60 | loss: 0.5 | first loop 0.40 sec, "
                        "tracing included")
    assert lines[2] == "train | step:     60/60 | loss: 0.5 | 25.0 steps/sec | ETA 0:00:00"
    assert all(ONE_FORMAT.match(line) for line in lines)


def test_a_skipped_loop_line_is_said_when_a_stop_ends_the_stretch_after_it():
    # A hook's stop request comes after the loop's line (the hooks run once the run may
    # write): the loop it stopped at is said, as the last of its stretch, once.
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    clock = [0.0]
    console.LOGGER.addHandler(handler)
    try:
        lines = console.TrainLines(clock=lambda: clock[0], min_interval=1.0)
        lines.loop_end(10, 60, {"loss": 0.5}, 10, 0.2, last=False)
        clock[0] += 0.2
        lines.loop_end(20, 60, {"loss": 0.4}, 10, 0.2, last=False)  # Within a second: skipped.
        lines.say_skipped()
        lines.say_skipped()
    finally:
        console.LOGGER.removeHandler(handler)
    assert [(r.ctl_step, r.ctl_progress) for r in records] == [(10, (10, 60, False)),
                                                               (20, (20, 60, True))]


def test_terminal_gets_a_bar_and_other_lines_above_it():
    clock = [0.0]
    terminal = Terminal()
    handler = console.Console(terminal, clock=lambda: clock[0])
    assert handler.use_bar
    emit_loops(handler, [10, 20, 30], 60, 0.5, clock)
    record = logging.LogRecord("ctl", logging.INFO, __file__, 1, "saved %s", ("ckpt-30",), None)
    record.ctl_kind, record.ctl_step = "ckpt", 30
    handler.emit(record)
    output = terminal.getvalue()
    assert "\r" in output  # Redrawn in place.
    assert "train | step:     30/60 |" in output and "20.0 steps/sec | ETA 0:00:02" in output
    assert " ckpt | step:     30 | saved ckpt-30\n" in output
    handler.close()


def run_on_a_terminal(args, columns, stop_when=None, timeout=240):
    """Runs `python -m ctl.run args` on a pseudo-terminal `columns` wide (stdout and stderr);
    sends SIGTERM once `stop_when(output so far)` holds; returns (exit status, output)."""
    with Process.ctl(*args, terminal=columns) as process:
        if stop_when:
            process.wait_until(lambda: stop_when(process.stdout()), timeout, poll_s=0.2)
            process.send_signal(signal.SIGTERM)
        return process.wait(timeout), process.stdout()


def screens(output):
    """Each state a terminal line went through: the text between line ends and carriage returns."""
    return [part for line in output.replace("\r\n", "\n").split("\n") for part in line.split("\r")]


def drawn_bars(output):
    """The states of the live bar (a line with a bar's block characters)."""
    return [s for s in screens(output) if "█" in s or "▏" in s or "▎" in s or "▌" in s]


def assert_fitted(bars, columns):
    """The bar, steps/sec and the ETA on every drawn bar, none wider than the terminal."""
    assert bars
    assert all(len(s.rstrip()) < columns for s in bars), [s for s in bars if len(s) >= columns]
    assert all(re.search(r"\d steps/sec \| ETA \d", s) or "first loop" in s for s in bars), bars


@pytest.mark.slow
def test_main_job_console_on_a_terminal_and_in_a_file(tmp_path):
    # A wide terminal: the metrics fit beside the bar (80 columns: the test below).
    status, terminal = run_on_a_terminal([f"--model_dir={tmp_path / 'tty'}", *MAIN_JOB], 160)
    assert status == 0, terminal[-2000:]
    # stdout and stderr, but TensorFlow's C++ log lines (e.g. cuInit's, before ctl runs).
    lines = ctl_stderr_lines("\n".join(screens(terminal)))
    assert lines, terminal
    assert not [line for line in lines if ABSL_PREFIX.match(line)], terminal
    assert [line for line in lines if not ONE_FORMAT.match(line)] == [], terminal
    assert "\r" in terminal.replace("\r\n", "")  # The bar is redrawn in place...
    bars = [line for line in lines if "steps/sec | ETA" in line and "|" in line]
    assert any("60/60" in line for line in bars)
    assert_fitted(drawn_bars(terminal), 160)
    assert re.search(r" eval \| step: +30 \| loss: ", terminal)
    assert re.search(r" ckpt \| step: +60 \| saved ", terminal)

    with open(tmp_path / "out.txt", "w") as out:
        result = subprocess.run(ctl_command(f"--model_dir={tmp_path / 'file'}", *MAIN_JOB),
                                cwd=ROOT, stdout=out, stderr=subprocess.PIPE, env=ctl_env(),
                                timeout=240)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    assert b"cuInit" not in result.stderr, result.stderr.decode()  # ctl.utils.devices, on a host with no GPU.
    text = (tmp_path / "out.txt").read_text()
    assert "\r" not in text and "█" not in text
    lines = text.splitlines()
    assert lines and all(ONE_FORMAT.match(line) for line in lines), text
    train = [line for line in lines if line.startswith("train | ")]
    assert "tracing included" in train[0] and train[-1].startswith("train | step:     60/60 |")
    assert "steps/sec | ETA 0:00:00" in train[-1]


@pytest.mark.slow
def test_the_bar_fits_the_terminal_keeps_history_and_ends_cleanly(tmp_path):
    columns = 80  # The metrics do not fit: cut to what is left.
    progress = tmp_path / "progress"

    def past_step_28(unused_output):
        steps = [int(s) for s in progress.read_text().split() if s.isdigit()] if progress.exists() else []
        return max(steps, default=0) >= 28

    status, output = run_on_a_terminal(
        ["--mode=train_and_eval", f"--model_dir={tmp_path / 'run'}",
         f"--gin_file={os.path.join(ROOT, 'tests', 'lifecycle.gin')}",
         f"--gin_bindings=PacedTask.progress_file='{progress}'"], columns, past_step_28)
    assert status == 75, output[-3000:]
    assert_fitted(drawn_bars(output), columns)
    lines = output.replace("\r\n", "\n").split("\n")
    # History: the end of the first stretch and its evaluation stay on the screen, above the bar.
    history = [line.split("\r")[-1] for line in lines]
    assert any(re.match(r"train \| step: +20/40 \| loss: .* steps/sec \| ETA", h) for h in history), history
    assert any(re.match(r" eval \| step: +20 \| loss: ", h) for h in history), history
    # The end: the preemption line from the first column of a line of its own (the bar
    # blanked before it), and no bar drawn after it.
    ends = [i for i, h in enumerate(history) if h.startswith("ctl.run: preempted: stopped by SIGTERM")]
    assert len(ends) == 1, lines[-5:]
    drawn = lines[ends[0]].split("\r")
    assert len(drawn) == 1 or not drawn[-2].strip(), drawn  # What was there last, blanked.
    after = "\n".join(lines[ends[0] + 1:])
    assert "steps/sec" not in after and "█" not in after, after
