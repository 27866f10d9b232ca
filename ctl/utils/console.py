"""What a run prints: one format for every line, and a live bar on a terminal.

Every line ctl prints goes through the `ctl` logger (Python's `logging`) with
a kind and, where there is one, the global step:

    train | step:    200/2000 | loss: 0.408, accuracy: 0.929 | 4420.4 steps/sec | ETA 0:00:01
     eval | step:    500 | loss: 0.115, accuracy: 0.972 | 0.2 sec
     ckpt | step:    500 | saved checkpoint to /tmp/digits/ckpt-500
     best | step:    500 | accuracy = 0.972, best so far: 0.972 (step 500)

The controller's `TrainLines` logs a train line for the first and the last
loop of each training stretch (up to an evaluation or the end) and otherwise
at most every 0.1 s. `python -m ctl.run` installs `Console` as the logger's
handler on stdout. On a terminal the train lines become one live bar (tqdm),
fitted to the terminal's width (the step, the bar, steps/sec and the ETA
first; the metrics get what is left), and the other lines are written above
it; the train line of each stretch's last loop, and one every
`HISTORY_SECONDS`, stay above it too, so the loss history stays on the screen.
`end_bar()` (ctl.run calls it before its last line) clears the bar for good.
Otherwise (a file, a pipe, CI) a train line is written for the first and the
last loop of each stretch and otherwise at most once a second. In a notebook or a test, with no handler installed,
records reach the root logger (absl's handler) like any other log line.

The rate and the time left (ETA) come from steady-state train loops only
(`Pace`: the time inside the loops' calls): the first loop after a start or a restore traces the step function,
and counting it would make the first ETA a guess. The ETA counts training
time; evaluations and checkpoints add theirs.
"""

import logging
import math
import os
import shutil
import sys
import time
from typing import Any, Dict, Optional, TextIO, Tuple

import numpy as np

LOGGER = logging.getLogger("ctl")
LOGGER.setLevel(logging.INFO)  # ctl's lines show wherever the root logger has a handler.
EVERY_SECONDS = 1.0  # Plain train lines, at most this often (besides a stretch's first and last).
HISTORY_SECONDS = 30.0  # On a terminal, a train line above the bar at least this often.
MIN_BAR_WIDTH, MAX_BAR_WIDTH = 10, 40


def info(kind: str, message: str, *args, step: Optional[int] = None) -> None:
    """Logs one console line of `kind` (`train`, `eval`, `ckpt`, ...), at `step` if given.

    Args:
        kind: the line's kind: `train`, `eval`, `ckpt`, ...
        message: a %-format string.
        step: the global step, if the line is about one.
        *args: its arguments.
    """
    LOGGER.info(message, *args, extra={"ctl_kind": kind, "ctl_step": step})


def warning(kind: str, message: str, *args, step: Optional[int] = None) -> None:
    """Like `info`, at WARNING level.

    Args:
        kind: the line's kind.
        message: a %-format string.
        step: the global step, if any.
        *args: its arguments.
    """
    LOGGER.warning(message, *args, extra={"ctl_kind": kind, "ctl_step": step})


def format_line(kind: str, step: Optional[int], message: str,
                target: Optional[int] = None) -> str:
    """The one format: `kind | step: N | message` (`step: N/T` with a target).

    Args:
        kind: the line's kind.
        step: the global step, or None.
        message: the text.
        target: the step training runs to (None: none shown).
    """
    if step is None:
        return f"{kind:>5} | {message}"
    of = f"/{target}" if target is not None else ""
    return f"{kind:>5} | step: {step:6d}{of} | {message}"


def format_logs(logs: Dict[str, Any], prefix: str = "") -> str:
    """`name: value, ...` on one line, scalars with 5 significant digits, sets as `set/name`.

    Args:
        logs: results by name, possibly nested by eval set.
        prefix: prepended to each name (for the recursion).
    """
    parts = []
    for name, value in logs.items():
        if isinstance(value, dict):
            parts.append(format_logs(value, f"{prefix}{name}/"))
            continue
        try:
            parts.append(f"{prefix}{name}: {float(np.asarray(value)):.5g}")
        except (TypeError, ValueError):
            parts.append(f"{prefix}{name}: {value!r}")
    return ", ".join(parts)


def format_duration(seconds: float) -> str:
    """`seconds` as `H:MM:SS` (`?` when not finite).

    Args:
        seconds: a duration.
    """
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


class Pace:
    """Steps/sec over steady-state train loops: the first loop after `restart()` is not counted.

    Pure Python; the controller times each loop and hands the duration in.
    """

    def __init__(self):
        self.restart()

    def restart(self) -> None:
        """The next loop traces again (a start, a restore): leave it out."""
        self._warm = False
        self._steps = 0
        self._seconds = 0.0

    def add(self, steps: int, seconds: float) -> Optional[float]:
        """Records one loop; returns the steady-state rate so far, or None.

        Args:
            steps: the loop's steps.
            seconds: how long it took.
        """
        if not self._warm:
            self._warm = True
            return None
        self._steps += steps
        self._seconds += seconds
        return self._steps / max(self._seconds, 1e-9)


class TrainLines:
    """The train line of each loop: logged for the first and last loop of a training
    stretch and otherwise at most every `min_interval` seconds (formatting and
    logging a line is a share of a short loop of a small model: bench/README.md).

    Args:
        clock: the time source (a test may pass its own).
        min_interval: seconds between two lines in the middle of a stretch.
    """

    def __init__(self, clock=time.monotonic, min_interval: float = 0.1):
        self.pace = Pace()
        self.clock = clock
        self.min_interval = min_interval
        self._last = None  # clock() of the last line; None: the next loop starts a stretch.
        # The last loop's line, if it was not said.
        self._skipped: Optional[Tuple[int, int, Dict[str, Any], float, Optional[float]]] = None

    def restart(self) -> None:
        self.pace.restart()
        self._last = None
        self._skipped = None

    def loop_end(self, step: int, target: int, logs: Dict[str, Any], steps: int,
                 seconds: float, last: bool) -> None:
        """One loop of `steps` steps took `seconds` and ended at `step` of `target`;
        `last` ends the stretch (an evaluation or the end of training follows).

        Args:
            step: the step the loop ended at.
            target: the step the stretch trains to.
            logs: the loop's results.
            steps: the loop's steps.
            seconds: how long it took.
            last: the loop ends the stretch.
        """
        rate = self.pace.add(steps, seconds)
        now = self.clock()
        if not last and self._last is not None and now - self._last < self.min_interval:
            self._skipped = (step, target, logs, seconds, rate)
            return
        self._skipped = None
        self._last = None if last else now
        self._say(step, target, logs, seconds, rate, last)

    def say_skipped(self) -> None:
        """The stretch ended after all (a stop was asked after the loop's line): the loop's line,
        if it was skipped."""
        if self._skipped is not None:
            step, target, logs, seconds, rate = self._skipped
            self._say(step, target, logs, seconds, rate, last=True)
        self._skipped = None
        self._last = None

    @staticmethod
    def _say(step: int, target: int, logs: Dict[str, Any], seconds: float,
             rate: Optional[float], last: bool) -> None:
        if rate is None:
            pace = f"first loop {seconds:.2f} sec, tracing included"
        else:
            eta = (target - step) / rate if rate > 0 else float("inf")
            pace = f"{rate:.1f} steps/sec | ETA {format_duration(eta)}"
        metrics = format_logs(logs)
        LOGGER.info("%s | %s", metrics, pace, extra={
            "ctl_kind": "train", "ctl_step": step, "ctl_progress": (step, target, last),
            "ctl_pace": pace, "ctl_metrics": metrics})


class Console(logging.Handler):
    """The handler `ctl.run` puts on the `ctl` logger: one format, a bar on a terminal.

    Args:
        stream: where the lines go (default: stdout).
        bar: draw a live progress bar (None: when `stream` is a terminal).
        clock: the time source (a test may pass its own).
        every_seconds: plain train lines (without a bar) at most this often (seconds).
        history_seconds: on a terminal, a train line is kept above the bar at least this often (seconds).
    """

    def __init__(self, stream: Optional[TextIO] = None, bar: Optional[bool] = None,
                 clock=time.monotonic, every_seconds: float = EVERY_SECONDS,
                 history_seconds: float = HISTORY_SECONDS):
        super().__init__()
        self.stream = stream or sys.stdout
        self.use_bar = self.stream.isatty() if bar is None else bar
        self.clock = clock
        self.every_seconds = every_seconds
        self.history_seconds = history_seconds
        self._bar: Optional[Any] = None  # A tqdm bar, once there is one.
        self._last_train_line = None  # clock() of the last plain train line.
        self._last_history = None  # clock() of the last train line above the bar.

    def emit(self, record: logging.LogRecord) -> None:
        """Writes one record: a line in the one format, or the bar's update for a train line.

        Args:
            record: the log record (ctl's lines carry their kind, step and progress).
        """
        try:
            progress = getattr(record, "ctl_progress", None)
            if progress is None:
                self._write(self._text(record))
            elif self.use_bar:
                self._update_bar(record, *progress)
            else:
                self._plain_train_line(record, *progress)
        except Exception:  # Logging's contract: report, never raise.
            self.handleError(record)

    def _text(self, record: logging.LogRecord, target: Optional[int] = None) -> str:
        kind = getattr(record, "ctl_kind", None) or record.levelname.lower()
        if record.levelno >= logging.WARNING and kind != record.levelname.lower():
            kind = f"{kind}: {record.levelname.lower()}"
        return format_line(kind, getattr(record, "ctl_step", None), record.getMessage(), target)

    def _write(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text, file=self.stream)  # Above the bar, which is redrawn.
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def _plain_train_line(self, record, step: int, target: int, last: bool) -> None:
        now = self.clock()
        first = self._last_train_line is None
        if first or last or now - self._last_train_line >= self.every_seconds:
            self._last_train_line = None if last else now
            self._write(self._text(record, target))

    def _update_bar(self, record, step: int, target: int, last: bool) -> None:
        import tqdm  # Only on a terminal.

        now = self.clock()
        if last or self._last_history is None or now - self._last_history >= self.history_seconds:
            self._last_history = None if last else now
            self._write(self._text(record, target))  # History, above the bar.
        if last or step >= target:
            self.close_bar()  # The line just written holds the stretch's end.
            return
        head = format_line("train", step, "", target)[:-1]
        pace = "| " + getattr(record, "ctl_pace", "")
        metrics = "| " + getattr(record, "ctl_metrics", record.getMessage())
        width = self._columns() - 1  # The last column would wrap on some terminals.
        room = width - len(head) - len(pace) - 2
        bar_width = max(MIN_BAR_WIDTH, min(MAX_BAR_WIDTH, room - len(metrics)))
        tail = f" {pace} {metrics}"[:max(width - len(head) - bar_width, 0)]
        # Braces escaped for tqdm's format.
        bar_format = f"{{desc}}{{bar:{bar_width}}}" + tail.replace("{", "{{").replace("}", "}}")
        if self._bar is None or self._bar.total != target or step < self._bar.n:
            self.close_bar()
            self._bar = tqdm.tqdm(total=target, initial=step, desc=head, file=self.stream,
                                  bar_format=bar_format, ncols=width, mininterval=0.1,
                                  leave=False)
        self._bar.set_description_str(head, refresh=False)
        self._bar.bar_format = bar_format
        self._bar.ncols = width
        self._bar.update(step - self._bar.n)
        self._bar.refresh()

    def _columns(self) -> int:
        try:
            return os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, OSError, ValueError):  # Not a real terminal (a test's stream).
            return shutil.get_terminal_size().columns

    def close_bar(self) -> None:
        """Clears the bar (its last state is in the history line above it)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def close(self) -> None:
        self.close_bar()
        super().close()


def end_bar() -> None:
    """Clears the live bar of the installed console, if any: what is written next
    (a last line on stderr) starts on a line of its own, and no bar is drawn again."""
    for handler in LOGGER.handlers:
        if isinstance(handler, Console):
            handler.close_bar()


def install(stream: Optional[TextIO] = None, bar: Optional[bool] = None,
            level: int = logging.INFO) -> Console:
    """Sends the `ctl` logger's lines to a `Console` on `stream` (stdout), and only there.

    Args:
        stream: where the lines go (default: stdout).
        bar: draw a live bar (None: on a terminal).
        level: the `ctl` logger's level.
    """
    for handler in list(LOGGER.handlers):
        if isinstance(handler, Console):
            LOGGER.removeHandler(handler)
            handler.close()
    console = Console(stream, bar)
    LOGGER.addHandler(console)
    LOGGER.setLevel(level)
    LOGGER.propagate = False
    return console
