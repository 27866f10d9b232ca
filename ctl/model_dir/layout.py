"""A model dir: every file ctl keeps in it, how each is named and how the run's records are read.

`ModelDir` (one per run) names the files that core writes and those its own
readers read (`checkpoint`, `config.gin`, `metrics.jsonl`, `eval/metrics.jsonl`,
`ctl_run_finished.json`, `evaluator.lock`, `train/`, `eval/`, ...); a file several
processes share has its name with its rule, in a module of this package
(`TRAINER_LOCK_FILE` in `ctl.model_dir.trainer_lock`, `SIDECAR_PROGRESS_FILE` in
`ctl.model_dir.sidecar_progress`); a file that only a layer above writes and reads has
its name there (`EARLY_STOPPING_FILE`, `BEST_DIR` and `BEST_RECORD_FILE` in
`ctl.hooks.best`, `EXPORT_DIR` in `ctl.hooks.exporting`, `PROFILE_DIR`, `REPORT_FILE`,
`SMOKE_EXPORT_DIR`, `SWEEP_PRUNED_FILE` in the modules that write them), each
joined through `ModelDir.file`: no module joins
a file name into a model dir by hand. It also reads the run's records (`metrics`,
`sidecar_evaluations`, and `evaluations_on_record`, the one answer to "which
steps were evaluated, with what results").
Every file, who writes it, when, and who reads it: docs/reference/model-dir.md.
"""

import json
import os
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import tensorflow as tf

from ctl.model_dir.checkpoints import (CHECKPOINT_INDEX, CHECKPOINT_STATE_FILE, CheckpointState, Restored,
                                       UnreadableCheckpointError, checkpoint_index, parse_checkpoint_state)
from ctl.model_dir.at_once import at_once
from ctl.model_dir.files import read_json, read_json_lines, read_text, write_atomically
from ctl.utils import console
from ctl.utils.errors import UserError, first_line

CONFIG_FILE = "config.gin"
OPERATIVE_CONFIG_FILE = "operative_config.gin"
EVALUATOR_FILE = "evaluator.lock"
FINISHED_FILE = "ctl_run_finished.json"
METRICS_FILE = "metrics.jsonl"
TRAIN_DIR = "train"
EVAL_DIR = "eval"
SIDECAR_METRICS_FILE = "metrics.jsonl"  # In EVAL_DIR.
RECORD_FIELDS = ("kind", "step", "time")  # A metrics.jsonl record's own fields; the rest are metrics.


def results_of(record: Dict[str, Any]) -> Dict[str, Any]:
    """The metrics of a `metrics.jsonl` record.

    Args:
        record: one record of `metrics.jsonl`.
    """
    return {name: value for name, value in record.items() if name not in RECORD_FIELDS}


# Summaries.


def eval_set_dir(summary_dir: str, eval_set: str) -> str:
    """`train/<set>/` or `eval/<set>/`: the summaries of the named eval set `eval_set` ("": the
    run's own), under `summary_dir` (`train/`, `eval/`, or a local staging copy of one).

    Args:
        summary_dir: `train/`, `eval/` or a local staging copy of one.
        eval_set: the eval set's name ("": the run's own).
    """
    return os.path.join(summary_dir, eval_set)


def uploaded_path(local: str, staged_dir: str, summary_dir: str) -> str:
    """Where the summary file `local`, under `staged_dir` (a local staging copy of
    `summary_dir`: `ctl.model_dir.staging`), is uploaded: the same place under `summary_dir`.

    Args:
        local: a summary file under `staged_dir`.
        staged_dir: the local staging copy of `summary_dir`.
        summary_dir: the summary dir in the object store.
    """
    return os.path.join(summary_dir, os.path.relpath(local, staged_dir))


class ModelDir:
    """The files of one model dir (a local path or a `gs://`-style URL).

    Args:
        path: the model dir: a local path or a `gs://`-style URL.
    """

    def __init__(self, path: str):
        self.path = path

    def __str__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"ModelDir({self.path!r})"

    def file(self, *names: str) -> str:
        """The path of `names` joined under the model dir: the one way a file name joins a model dir.

        Args:
            *names: the path's parts below the model dir, e.g. `"eval", "metrics.jsonl"`.
        """
        return os.path.join(self.path, *names)

    def exists(self) -> bool:
        return tf.io.gfile.exists(self.path)

    def is_file(self) -> bool:
        """Whether the path names something that is not a directory (a user mistake)."""
        return tf.io.gfile.exists(self.path) and not tf.io.gfile.isdir(self.path)

    def check_writable(self) -> None:
        """Raises `UserError` if the model dir cannot be created or written; writes nothing.

        (On `gs://`-style paths nothing can be checked without writing: the
        first write tells.)
        """
        if "://" in self.path:
            return
        path = os.path.abspath(self.path)
        if os.path.exists(path) and not os.path.isdir(path):
            raise UserError(f"--model_dir={self.path} is a file, not a directory; choose a "
                            "directory.")
        existing = path
        while not os.path.exists(existing):
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing):
            raise UserError(f"cannot write to --model_dir={self.path} ({existing} is a file); "
                            "choose a directory you can write to.")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise UserError(f"cannot write to --model_dir={self.path} ({existing} is not "
                            "writable); choose a directory you can write to.")

    def create(self) -> None:
        """Creates the model dir (and its parents) if needed."""
        try:
            tf.io.gfile.makedirs(self.path)
        except (tf.errors.OpError, OSError) as error:
            raise UserError(f"cannot write to --model_dir={self.path} ({first_line(error)}); "
                            "choose a directory you can write to.") from error

    # What lives where.

    @property
    def config_file(self) -> str:
        return self.file(CONFIG_FILE)

    @property
    def operative_config_file(self) -> str:
        return self.file(OPERATIVE_CONFIG_FILE)

    @property
    def evaluator_file(self) -> str:
        """The evaluator role's one record (`ctl.model_dir.evaluator_role`)."""
        return self.file(EVALUATOR_FILE)

    @property
    def finished_file(self) -> str:
        return self.file(FINISHED_FILE)

    @property
    def metrics_file(self) -> str:
        return self.file(METRICS_FILE)

    @property
    def train_dir(self) -> str:
        return self.file(TRAIN_DIR)

    @property
    def eval_dir(self) -> str:
        return self.file(EVAL_DIR)

    @property
    def sidecar_metrics_file(self) -> str:
        return self.file(EVAL_DIR, SIDECAR_METRICS_FILE)

    # The run's records.

    def metrics(self, kind: Optional[str] = None) -> List[Dict[str, Any]]:
        """The records of `metrics.jsonl` (of one `kind`: "train" or "eval"), oldest first.

        Args:
            kind: "train" or "eval" (None: every record).
        """
        records = read_json_lines(self.metrics_file)
        return [r for r in records if kind is None or r.get("kind") == kind]

    def sidecar_evaluations(self) -> List[Dict[str, Any]]:
        """The sidecar's records in `eval/metrics.jsonl`, one per evaluated checkpoint
        (`{"checkpoint", "number", "step", "results", ...}`); a record without its
        checkpoint's number is damaged and skipped."""
        return [r for r in read_json_lines(self.sidecar_metrics_file)
                if isinstance(r.get("number"), int)]

    def evaluations_on_record(self) -> Dict[Any, Dict[str, Any]]:
        """The evaluations already on record, step -> results: the trainer's in-line ones
        (`metrics.jsonl`) and the sidecar's (`eval/metrics.jsonl`); where both evaluated a
        step, the trainer's."""
        recorded = {r.get("step"): r.get("results") or {} for r in self.sidecar_evaluations()}
        recorded.update({r.get("step"): results_of(r) for r in self.metrics("eval")})
        return recorded

    # The run-finished marker.

    def mark_finished(self, step: int, final_checkpoint: Optional[str],
                      train_steps: Optional[int] = None) -> None:
        """Records (atomically) that training ended, its final checkpoint, and the
        `train_steps` it was asked for (an early stop ends before them).

        Args:
            step: the step training ended at.
            final_checkpoint: the final checkpoint's path (None: none written).
            train_steps: `ctl.Schedule.train_steps`, the steps asked for.
        """
        text = json.dumps({"final_step": step, "final_checkpoint":
                           final_checkpoint and os.path.basename(final_checkpoint),
                           "train_steps": train_steps})
        write_atomically(self.finished_file, text + "\n")

    def clear_finished(self) -> None:
        """Called when training (re)starts: the run is no longer finished."""
        if tf.io.gfile.exists(self.finished_file):
            tf.io.gfile.remove(self.finished_file)

    def final_checkpoint_number(self, train_steps: Optional[int] = None) -> Optional[int]:
        """The number of the trainer's final checkpoint, once it marked the run finished.

        With `train_steps`, a marker of a run asked for fewer steps is stale (the
        run is being extended and its trainer has not cleared it yet): None.

        Args:
            train_steps: the steps this run is asked for (None: any marker counts).
        """
        data = read_json(self.finished_file)
        if not isinstance(data, dict):
            return None
        finished_for = data.get("train_steps")
        if train_steps is not None and isinstance(finished_for, int) and finished_for < train_steps:
            return None
        match = CHECKPOINT_INDEX.match(f"{data.get('final_checkpoint')}.index")
        if match:
            return int(match.group(2))
        step = data.get("final_step")
        return step if isinstance(step, int) else None

    # Checkpoints.

    def checkpoint_path(self, name: str) -> str:
        """Where the checkpoint `name` (`ckpt-N`, its prefix) or one of its files
        (`ckpt-N.index`, `ckpt-N.data-*`) lives in this dir.

        Args:
            name: `ckpt-N`, or one of its files' names.
        """
        return self.file(name)

    def checkpoints(self) -> Dict[int, str]:
        """Maps the number of every checkpoint (`NAME-N.index`) to its path, whatever the state file says."""
        try:
            names = tf.io.gfile.listdir(self.path)
        except tf.errors.OpError:  # Not there (yet), or not a directory.
            return {}
        found = {}
        for name in sorted(names):
            match = CHECKPOINT_INDEX.match(name)
            if match and not match.group(1).endswith("_temp"):
                found.setdefault(int(match.group(2)), self.checkpoint_path(match.group(0)[:-len(".index")]))
        return found

    def checkpoint_state(self) -> CheckpointState:
        """The `checkpoint` state file, read defensively (never raises)."""
        path = self.file(CHECKPOINT_STATE_FILE)
        try:
            text = read_text(path)
            if text is None:
                return CheckpointState()
            fields = parse_checkpoint_state(text)
        except ValueError as error:
            return CheckpointState(problem=f"{path} is unreadable ({first_line(error)})")
        latest = fields.get("model_checkpoint_path")
        if not latest:
            return CheckpointState(problem=f"{path} names no checkpoint")
        return CheckpointState(self._absolute(latest[-1]),
                               [self._absolute(p) for p in fields.get("all_model_checkpoint_paths", [])])

    def _absolute(self, path: str) -> str:
        return path if os.path.isabs(path) or "://" in path else self.checkpoint_path(path)

    def committed_checkpoints(self, settle_seconds: float,
                              found: Optional[Dict[int, str]] = None) -> Dict[int, str]:
        """The checkpoints (of `found`) that are complete: named in the state file, or
        with an index file `settle_seconds` old (a state file that cannot be read names none).

        Args:
            settle_seconds: how old an index file not named in the state file must be.
            found: `{number: path}` to look at (None: every checkpoint of the dir).
        """
        found = self.checkpoints() if found is None else found
        if not found:
            return found
        state = self.checkpoint_state()
        named = {os.path.basename(p) for p in (state.latest, *state.all) if p}
        ready = {}
        now = time.time()
        for number, path in found.items():
            if os.path.basename(path) in named:
                ready[number] = path
                continue
            try:
                mtime = tf.io.gfile.stat(checkpoint_index(path)).mtime_nsec / 1e9
            except tf.errors.NotFoundError:
                continue
            if now - mtime >= settle_seconds:
                ready[number] = path
        return ready

    def first_look(self) -> Tuple[CheckpointState, Dict[int, str]]:
        """The state file and the checkpoints (`checkpoint_state`, `checkpoints`), read side by
        side in an object store: what `restore_newest` reads first."""
        found = at_once(self.path, {"state": self.checkpoint_state, "found": self.checkpoints})
        return found["state"], found["found"]

    def restore_newest(self, restore: Callable[[str], Any], looks: int = 3,
                       first: Optional[Tuple[CheckpointState, Dict[int, str]]] = None) -> Restored:
        """Restores the latest checkpoint with `restore(path)`, by the corruption policy.

        `restore` raises `UnreadableCheckpointError` for a checkpoint that is
        gone or damaged (the next one is tried) and `UserError` for one of a
        different model (raised on). When none restored and one was deleted
        while it was read (a live trainer retires its old checkpoints), the
        model dir is looked at again, up to `looks` times. Reads only; writes
        nothing.

        Args:
            restore: restores one checkpoint, given its path.
            looks: how many times the dir is looked at when checkpoints were deleted meanwhile.
            first: what `first_look` read, if it was read ahead (None: read now).
        """
        state, found = first or self.first_look()
        by_name = {os.path.basename(p): n for n, p in found.items()}
        newest_first = [found[n] for n in sorted(found, reverse=True)]
        problem = state.problem
        if state.latest is not None:
            named = os.path.basename(state.latest)
            if named in by_name:  # The committed latest first, as TensorFlow would.
                newest_first.remove(found[by_name[named]])
                newest_first.insert(0, found[by_name[named]])
            else:
                problem = f"{self.file(CHECKPOINT_STATE_FILE)} names {named}, which is not there"
        if not newest_first:
            if problem and state.latest is None:
                console.warning("ckpt", "%s; the model dir holds no checkpoint (*.index): starting "
                                "from scratch.", problem)
            return Restored(None)
        skipped = []  # (name, why)
        for path in newest_first:
            try:
                restore(path)
            except UnreadableCheckpointError as error:
                skipped.append((os.path.basename(path), str(error)))
                continue
            stale = bool(problem or skipped)
            if stale:
                why = [problem] if problem else []
                why += [f"skipped {name} ({reason})" for name, reason in skipped]
                console.warning("ckpt", "%s; restored %s, the newest checkpoint that restores.",
                                "; ".join(why), os.path.basename(path))
            number = by_name[os.path.basename(path)]
            failed = {name for name, _ in skipped}
            keep = [found[n] for n in sorted(found)
                    if n <= number and os.path.basename(found[n]) not in failed]
            return Restored(path, stale, keep)
        if looks > 1 and any(not tf.io.gfile.exists(checkpoint_index(self.checkpoint_path(name)))
                             for name, _ in skipped):
            return self.restore_newest(restore, looks - 1)  # Newer ones came meanwhile.
        names = ", ".join(f"{name}.*" for name, _ in skipped)
        reasons = "; ".join(f"{name}: {reason}" for name, reason in skipped)
        raise UserError(
            f"no checkpoint in --model_dir={self.path} can be restored ({reasons}); delete "
            f"the damaged files ({names}) to train from scratch, or use a new --model_dir."
        )

    def write_checkpoint_state(self, restored: Restored, quiet: bool = False,
                               stamps: Optional[Dict[str, float]] = None) -> None:
        """Rewrites the state file (atomically, as TensorFlow's manager writes it) to
        name `restored.path` as the latest and `restored.keep` as the checkpoints to manage.

        Args:
            restored: what `restore_newest` restored.
            quiet: write no console line.
            stamps: when each kept checkpoint was written, by path (default: its index file's time).
        """
        known, times = stamps or {}, []
        for path in restored.keep:  # When each was written: `stamps`, else its index's time.
            try:
                times.append(known.get(path) or tf.io.gfile.stat(checkpoint_index(path)).mtime_nsec / 1e9)
            except tf.errors.NotFoundError:
                times.append(time.time())
        lines = [f"model_checkpoint_path: {json.dumps(os.path.basename(restored.path))}"]
        lines += [f"all_model_checkpoint_paths: {json.dumps(os.path.basename(p))}"
                  for p in restored.keep]
        lines += [f"all_model_checkpoint_timestamps: {stamp!r}" for stamp in times]
        lines.append(f"last_preserved_timestamp: {min(times, default=time.time()) - 1!r}")
        write_atomically(self.file(CHECKPOINT_STATE_FILE), "\n".join(lines) + "\n")
        if not quiet:
            console.info("ckpt", "rewrote %s: the latest checkpoint is %s",
                         self.file(CHECKPOINT_STATE_FILE), os.path.basename(restored.path))
