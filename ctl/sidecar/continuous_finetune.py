"""Continuous fine-tuning: fine-tune from each new checkpoint of another run, each once, in order.

`python -m ctl.train --mode=continuous_train_and_eval` (Model Garden NLP's mode) runs it on the
directory of the experiment's `task.init_checkpoint`, a pretraining run's model dir:

    for each checkpoint ckpt-N of the watched dir, in number order (`ctl.sidecar.scheduler`
      picks it, as for the sidecar evaluator; a dir not there yet is waited for):
        train_and_eval in <model_dir>/finetune/ckpt-N/, with `Finetuning.bindings` of it
          (Model Garden's: task.init_checkpoint is that checkpoint)
        Finetuning.report(its final evaluation)   (Model Garden's metrics-<step>.json and eval/)
        one line in <model_dir>/eval/metrics.jsonl, then eval/sidecar_progress.json
    until no new checkpoint came for `ctl.ContinuousEval.timeout` seconds after the last
    fine-tune, and the watched run reached `Finetuning.pretrain_steps` (when given)

Each fine-tune is a model dir of its own: a restart (after kill -9 too) goes on with the
fine-tune it was in, from that fine-tune's last checkpoint, and skips every fine-tune on record,
as the sidecar skips what it evaluated (`ctl.model_dir.sidecar_progress`). The final evaluation
of `train_and_eval` (at its last step) is the fine-tune's result. A checkpoint of the watched
run deleted before its fine-tune began, or that cannot be read, is recorded as such (one
warning) and passed over. SIGTERM or SIGINT while waiting raises `continuous_eval.Stopped`;
during a fine-tune, the trainer's preemption (a checkpoint, exit 75) applies.
"""

import dataclasses
import gc
import os
import re
import time
from typing import Any, Callable, Dict, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from ctl.core.checkpoint_contents import GLOBAL_STEP, SavedGraph
from ctl.core.stop import SignalWatcher
from ctl.model_dir import JsonLines, ModelDir, checkpoint_index
from ctl.sidecar import continuous_eval
from ctl.sidecar import scheduler as sidecar
from ctl.utils import console
from ctl.utils.errors import UserError

FINETUNE_DIR = "finetune"  # <model_dir>/finetune/ckpt-N/: the fine-tune from the watched ckpt-N.
_FINETUNE_NAME = re.compile(r"^ckpt-(\d+)/?$")


class Pretrained(NamedTuple):
    """A checkpoint of the watched run, and where its fine-tune runs.

    Args:
        number: the checkpoint's number (`ckpt-N`).
        path: its prefix.
        step: the watched run's global step in it (its number when it holds no `global_step`).
        directory: the fine-tune's model dir, `<model_dir>/finetune/ckpt-N/`.
    """

    number: int
    path: str
    step: int
    directory: ModelDir


@dataclasses.dataclass(frozen=True)
class Finetuning:
    """What continuous fine-tuning watches, and what makes each fine-tune and its record.

    Args:
        watched: the directory whose checkpoints are fine-tuned from (Model Garden's
            `task.init_checkpoint`).
        bindings: the gin bindings of one fine-tune, after the run's own (given its `Pretrained`).
        report: called with the `Pretrained` and the fine-tune's final evaluation, before the
            fine-tune is on record (a restart after a kill in it calls it again).
        pretrain_steps: the watched run's last step (Model Garden's `--pretrain_steps`): the
            timeout ends the job only once a checkpoint of that step or later was fine-tuned
            (None: the timeout ends it).
    """

    watched: str
    bindings: Callable[[Pretrained], Sequence[str]]
    report: Callable[[Pretrained, Dict[str, Any]], None] = lambda pretrained, results: None
    pretrain_steps: Optional[int] = None

    def __post_init__(self):
        if self.pretrain_steps is not None and (isinstance(self.pretrain_steps, bool)
                                                or self.pretrain_steps < 1):
            raise UserError(f"--pretrain_steps ({self.pretrain_steps!r}) must be a positive "
                            "number of steps, or unset.")


def finetune_directory(directory: ModelDir, number: int) -> ModelDir:
    """`<model_dir>/finetune/ckpt-N/`: the fine-tune from the watched run's checkpoint `number`.

    Args:
        directory: the job's model dir.
        number: the watched checkpoint's number.
    """
    return ModelDir(directory.file(FINETUNE_DIR, f"ckpt-{number}"))


def finetune_continuously(directory: ModelDir, finetuning: Finetuning,
                          finetune: Callable[[Pretrained], Dict[str, Any]],
                          settings: sidecar.ContinuousEval, clock=time.monotonic) -> Dict[str, Any]:
    """Fine-tunes from each checkpoint of `finetuning.watched` (the module docstring's loop);
    returns the last fine-tune's results.

    Args:
        directory: the job's model dir.
        finetuning: what to watch, each fine-tune's bindings and its report.
        finetune: runs `train_and_eval` of one fine-tune in its `Pretrained.directory` (with its
            bindings) and returns its final evaluation's results.
        settings: the watcher's settings: its timeout, policy, poll interval, settle time and
            `max_evaluations` (fine-tunes, counted over restarts).
        clock: the time source of the timeout (a test may pass its own).

    Raises:
        UserError: the watched path is a file, or no directory after the timeout.
        continuous_eval.Stopped: SIGTERM or SIGINT while waiting.
    """
    watch = _Watch(directory, ModelDir(finetuning.watched), settings, clock)
    console.info("finetune", "fine-tuning from each checkpoint of %s in %s/: policy=%s, timeout=%s "
                 "s, pretrain_steps=%s; %d checkpoint(s) already handled", finetuning.watched,
                 directory.file(FINETUNE_DIR), settings.policy, settings.timeout,
                 finetuning.pretrain_steps, len(watch.progress.outcomes))
    metrics = JsonLines(directory.sidecar_metrics_file, background=False)
    last: Dict[str, Any] = {}
    try:
        while True:
            found = watch.next_checkpoint(finetuning.pretrain_steps)
            if found is None:
                return last
            pretrained = watch.pretrained(*found)
            if pretrained is None:
                continue
            started = time.time()
            console.info("finetune", "fine-tuning from %s (step %d) in %s",
                         os.path.basename(pretrained.path), pretrained.step, pretrained.directory)
            results = _to_python(finetune(pretrained) or {})
            finetuning.report(pretrained, results)
            metrics.append({"checkpoint": os.path.basename(pretrained.path),
                            "number": pretrained.number, "step": pretrained.step,
                            "results": results, "model_dir": pretrained.directory.path,
                            "started": started, "finished": time.time()})
            watch.done(pretrained)
            console.info("finetune", "fine-tuned from %s: %s", os.path.basename(pretrained.path),
                         console.format_logs(results), step=pretrained.step)
            last = results
            gc.collect()  # The fine-tune's model and datasets, before the next one's (as Model Garden).
    finally:
        metrics.close()


class _Watch:
    """The watched dir, the job's progress record and the fine-tune dirs begun."""

    def __init__(self, directory: ModelDir, watched: ModelDir, settings: sidecar.ContinuousEval,
                 clock):
        self.directory = directory
        self.watched = watched
        self.settings = settings
        self.clock = clock
        self._check_watched()
        self.progress = continuous_eval.load_progress(directory)
        steps = [r["step"] for r in directory.sidecar_evaluations() if isinstance(r.get("step"), int)]
        self.reached = max(steps, default=None)  # The last step fine-tuned from (a restart's too).
        self.seen: Dict[int, str] = {}

    def _check_watched(self) -> None:
        if self.watched.is_file():
            raise UserError(f"task.init_checkpoint={self.watched.path} is a file; "
                            "--mode=continuous_train_and_eval fine-tunes from each checkpoint of "
                            "a directory: point it at the pretraining run's model dir.")

    def _begun(self) -> Dict[int, str]:
        """Fine-tunes begun and not on record (a restart goes on with them first), by number."""
        try:
            names = tf.io.gfile.listdir(self.directory.file(FINETUNE_DIR))
        except tf.errors.NotFoundError:
            return {}
        numbers = [int(m.group(1)) for m in map(_FINETUNE_NAME.match, names) if m]
        return {n: self.watched.checkpoint_path(f"ckpt-{n}") for n in numbers
                if not self.progress.handled(n)}

    def next_checkpoint(self, pretrain_steps: Optional[int]) -> Optional[Tuple[int, str]]:
        """Waits for the next checkpoint to fine-tune from: (its number, its path), or None
        at the end. The timeout counts from now (the end of the last fine-tune), as Model
        Garden's checkpoints iterator counts it."""
        scheduler = sidecar.Scheduler(self.settings, self.progress, clock=self.clock)
        waiting = said_steps = False
        with SignalWatcher(train=False) as signals:
            while True:
                if signals.requested():
                    raise continuous_eval.Stopped(signals.signum, self.progress.evaluations,
                                                  what="the fine-tuning job", unit="fine-tune(s)")
                self._check_watched()
                present = self.watched.checkpoints()
                begun = self._begun()
                ready = {**self.watched.committed_checkpoints(self.settings.settle_seconds,
                                                              present),
                         **{n: present.get(n, path) for n, path in begun.items()}}
                self._record_vanished(present, begun)
                self.seen = dict(ready)
                decision = scheduler.decide(ready, None, {**present, **begun})
                if decision.kind == sidecar.EVALUATE:
                    for number in decision.skipped:
                        console.info("finetune", "skipping %s: a newer checkpoint is ready "
                                     "(policy=latest)", os.path.basename(ready[number]))
                        self._record(number, sidecar.SKIPPED)
                    return decision.number, ready[decision.number]
                if decision.kind == sidecar.MAX_EVALUATIONS:
                    console.info("finetune", "stopping: %d fine-tunes reached "
                                 "ctl.ContinuousEval.max_evaluations", self.progress.evaluations)
                    return None
                if decision.kind == sidecar.TIMEOUT:
                    if not tf.io.gfile.isdir(self.watched.path):
                        raise UserError(
                            f"task.init_checkpoint={self.watched.path} is not a directory after "
                            f"{self.settings.timeout:g} s (trainer.continuous_eval_timeout); "
                            "point it at the pretraining run's model dir, or start that run.")
                    if not (pretrain_steps and (self.reached or 0) < pretrain_steps):
                        console.info("finetune", "no new checkpoint in %s for %g s: done",
                                     self.watched.path, self.settings.timeout)
                        return None
                    if not said_steps:
                        console.info("finetune", "no new checkpoint for %g s, but the last "
                                     "fine-tuned step (%s) is below --pretrain_steps=%d: waiting "
                                     "on", self.settings.timeout, self.reached, pretrain_steps)
                        said_steps = True
                elif not waiting:
                    console.info("finetune", "waiting for a new checkpoint in %s",
                                 self.watched.path)
                    waiting = True
                time.sleep(self.settings.poll_interval)

    def pretrained(self, number: int, path: str) -> Optional[Pretrained]:
        """The checkpoint to fine-tune from, or None when it is gone or unreadable and its
        fine-tune has no checkpoint of its own to go on from (recorded, one warning)."""
        directory = finetune_directory(self.directory, number)
        name = os.path.basename(path)
        try:
            step = _saved_step(path)
        except (tf.errors.OpError, ValueError, IndexError) as error:
            if directory.checkpoints():  # Begun: it goes on from its own checkpoint.
                step = None
            elif not tf.io.gfile.exists(checkpoint_index(path)):
                console.warning("finetune", "skipping %s: deleted before its fine-tune (e.g. by "
                                "the pretraining run's max_to_keep)", name)
                self._record(number, sidecar.DELETED)
                return None
            else:
                console.warning("finetune", "skipping %s, recorded as failed: it cannot be read "
                                "(%s)", name, str(error).splitlines()[0])
                self._record(number, sidecar.FAILED)
                return None
        return Pretrained(number, path, number if step is None else step, directory)

    def done(self, pretrained: Pretrained) -> None:
        self._record(pretrained.number, sidecar.EVALUATED)
        self.reached = max(self.reached or pretrained.step, pretrained.step)

    def _record(self, number: int, outcome: str) -> None:
        self.progress.record(number, outcome)
        continuous_eval.save_progress(self.directory, self.progress)

    def _record_vanished(self, present: Dict[int, str], begun: Dict[int, str]) -> None:
        """Checkpoints seen ready, gone before their fine-tune began, are recorded `deleted`."""
        for number in sorted(set(self.seen) - set(present) - set(begun)):
            if not self.progress.handled(number):
                console.warning("finetune", "skipping %s: deleted before its fine-tune (e.g. by "
                                "the pretraining run's max_to_keep)",
                                os.path.basename(self.seen[number]))
                self._record(number, sidecar.DELETED)


def _saved_step(path: str) -> Optional[int]:
    """The `global_step` checkpoint `path` holds (Model Garden's and ctl's), or None."""
    reader = tf.train.load_checkpoint(path)
    graph = SavedGraph(reader)
    key = graph.key(graph.node(GLOBAL_STEP))
    return None if key is None else int(reader.get_tensor(key))


def _to_python(value):
    if isinstance(value, dict):
        return {k: _to_python(v) for k, v in value.items()}
    array = np.asarray(value)
    return array.item() if array.ndim == 0 else array.tolist()
