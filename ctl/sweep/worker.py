"""A worker: takes trials of the study one at a time and runs each to its end.

In order, it runs: the RUNNING trials of its own slot (its predecessor died
running them: they resume from their checkpoints, same number, same values),
a RUNNING trial of another worker whose heartbeat is older than the grace
period (its machine died: taken over before any new trial starts, by one
worker, `Study.take_over_stale`), and the next WAITING trial of the budget.
A trial it ran but no longer owns when it ends (another worker took it over
meanwhile: this one was frozen longer than the grace) is left to that worker,
not told. With none of them but trials
still running elsewhere it waits (one may need taking over); it ends when every
trial of the budget ended, or none runs once the sweep file's `timeout` passed
(no trial starts after it; the study's `Study.timed_out`).

SIGTERM (or SIGINT) is passed to the running trial once (a session of its
own: no terminal's signal reaches it directly), which saves a checkpoint and
exits 75; the trial stays RUNNING in the study (to resume) and the worker exits
75.
"""

import signal
import threading
from typing import TYPE_CHECKING, Optional, Sequence

from optuna.trial import TrialState

from ctl.sweep import progress, runner
from ctl.sweep.launcher import FORKS, Launcher
from ctl.sweep.study import FAIL_REASON, MODEL_DIR, Study
from ctl.sweep.sweep_dir import trial_dir
from ctl.sweep.sweep_file import SweepFile

if TYPE_CHECKING:
    from ctl.model_dir import ModelDir
    from ctl.model_dir.sweep_workers import Slot

EXIT_PREEMPTED = runner.EXIT_PREEMPTED
IDLE_POLL_S = 2.0


class Worker:
    def __init__(self, study: Study, sweep: SweepFile, sweep_dir: str, slot: "Slot",
                 gin_files: Sequence[str], gin_bindings: Sequence[str],
                 search_paths: Sequence[str], heartbeat_s: float, grace_s: float,
                 storage: Optional[str] = None, trials_dir: Optional[str] = None,
                 fork_trials: bool = FORKS):
        """`storage`: the sweep command's `--storage` (None: the journal file in `sweep_dir`),
        which each trial's run opens to report to the study. `trials_dir`: where new trials'
        model dirs go (`ctl.sweep.sweep_dir.trial_dir`). `fork_trials`: start each trial
        forked from a warm launcher (`ctl.sweep.launcher`), else in a new process.

        Args:
            study: the sweep's study.
            sweep: the parsed sweep file.
            sweep_dir: the sweep dir (local: the study's journal, the record, the workers' slots, the trial logs).
            slot: this worker's slot.
            gin_files: the sweep command's `--gin_file`s, passed on to every trial.
            gin_bindings: its `--gin_bindings`, before the trial's own.
            search_paths: its `--gin_search_paths`.
            heartbeat_s: seconds between a trial's heartbeats.
            grace_s: seconds a heartbeat may be old before another worker takes its trial over.
            storage: the sweep command's `--storage`.
            trials_dir: where new trials' model dirs go.
            fork_trials: start each trial forked from a warm launcher.
        """
        self.study, self.sweep, self.sweep_dir, self.slot = study, sweep, sweep_dir, slot
        self.storage, self.trials_dir = storage, trials_dir
        self.gin_files, self.gin_bindings, self.search_paths = gin_files, gin_bindings, search_paths
        self.heartbeat_s, self.grace_s = heartbeat_s, grace_s
        self.stop = threading.Event()
        self.launcher = Launcher(fork=fork_trials)  # Started at the first trial, kept warm.

    def say(self, text: str) -> None:
        """Prints one of the worker's lines.

        Args:
            text: the line.
        """
        progress.say(f"sweep | worker {self.slot.index} | {text}")

    def install_signals(self) -> None:
        def on_signal(signum, unused_frame):
            if not self.stop.is_set():
                self.say(f"received {signal.Signals(signum).name}: stopping the trial at a "
                         "checkpoint")
            self.stop.set()

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, on_signal)

    def run(self) -> int:
        """Runs trials until the budget is spent (0) or a signal stops it (75)."""
        try:
            return self._run_trials()
        finally:
            self.launcher.close()

    def _run_trials(self) -> int:
        while not self.stop.is_set():
            number = self._next()
            if number is None:
                counts = self.study.counts()
                if counts["running"] == 0 and counts["waiting"] == 0:
                    return 0
                if counts["running"] == 0 and self.study.timed_out():
                    self.say(f"timeout: the sweep is {self.study.timeout:g} s old; "
                             f"{counts['waiting']} trial(s) of the budget not started")
                    return 0
                self.stop.wait(IDLE_POLL_S)
                continue
            self._run(number)
        return EXIT_PREEMPTED

    def _next(self):
        orphans = self.study.orphans(self.slot)
        if orphans:
            number = orphans[0].number
            self.say(f"trial {number}: resuming it (its worker in this slot ended before it did)")
            return number
        taken = self.study.take_over_stale(self.slot, self.grace_s)
        if taken is not None:
            from ctl.model_dir.sweep_workers import OWNER

            stale, age = taken
            self.say(f"trial {stale.number}: taking it over (its heartbeat is {age:.0f} s old, "
                     f"grace {self.grace_s:g} s; owner {stale.system_attrs.get(OWNER)})")
            recorded = self._model_dir(stale)
            # Reachable from here (a bucket, a shared file system), or a new one in this sweep dir.
            model_dir = recorded if recorded and recorded.exists() else self._trial_dir(
                stale.number)
            self.study.own(stale.number, self.slot, model_dir)
            return stale.number
        number = self.study.claim_next()
        if number is not None:
            self.study.own(number, self.slot, self._trial_dir(number))
            return number
        return None

    def _run(self, number: int) -> None:
        model_dir = self._model_dir(self.study.trial(number)) or self._trial_dir(number)
        while True:
            outcome = runner.run(self.study, number, self.sweep, model_dir, self.gin_files,
                                 self.gin_bindings, self.search_paths, self.stop,
                                 self.heartbeat_s, self.say, sweep_dir=self.sweep_dir,
                                 storage=self.storage, launcher=self.launcher)
            if outcome.state != "again":
                break
            self.say(f"trial {number}: its run stopped on its own ({outcome.message}); resuming it")
        if outcome.state == "interrupted":
            self.say(f"trial {number}: stopped at a checkpoint; the same command resumes it")
            return
        owner = self.study.owner(number)
        if owner != self.slot.key:
            self.say(f"trial {number}: {owner} took it over while it ran; leaving it to that "
                     f"worker ({outcome.state} here: {outcome.message or 'no message'})")
            return
        if outcome.state == "failed":
            self.study.set_attr(number, FAIL_REASON, outcome.message)
            self.study.set_attr(number, "fail_reason", outcome.message, user=True)
            self._tell(number, None, TrialState.FAIL)
        elif outcome.state == "pruned":
            self._tell(number, None, TrialState.PRUNED)
        else:
            self._tell(number, outcome.value, TrialState.COMPLETE)
        seconds = progress.trial_seconds(self.study.trial(number))  # As `ctl.report` says it.
        detail = f" = {outcome.value:.6g}" if outcome.value is not None else ""
        self.say(f"trial {number}: {outcome.state}{detail} in {seconds or 0:.0f} s"
                 f"{': ' + outcome.message if outcome.message else ''}")
        self.say(progress.line(self.study, self.sweep.objective))

    def _trial_dir(self, number: int) -> "ModelDir":
        from ctl.model_dir import ModelDir

        return ModelDir(trial_dir(self.sweep_dir, number, self.trials_dir))

    @staticmethod
    def _model_dir(trial) -> Optional["ModelDir"]:
        """The model dir the study records for `trial` (None: none yet)."""
        from ctl.model_dir import ModelDir

        recorded = trial.system_attrs.get(MODEL_DIR)
        return ModelDir(recorded) if recorded else None

    def _tell(self, number: int, value, state) -> None:
        try:
            self.study.optuna.tell(number, value, state=state)
        except RuntimeError as error:  # GridSampler stops the study when its grid is done.
            if "Study.stop" not in str(error):
                raise
