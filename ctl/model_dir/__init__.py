"""The model dir, and every file and record several processes share, with its rule.

`layout` names every file of a model dir (`ModelDir`, one per run) and reads the
run's records; `files` writes and reads one file (atomically, whole, JSON lines) and
publishes directories whole; `checkpoints` tells a checkpoint's files and reads the
state file. Across processes, each shared file's rule in one module: the primitives,
`claims` (one interface, `Claim`: a `file_lock` on a file system, a `lease` in an
object store, the holder's record in `holders`); one trainer per model dir
(`trainer_lock`: `trainer.lock`); who evaluates and runs the eval-side hooks
(`evaluator_role`: `evaluator.lock`); what a sidecar did with each checkpoint, for the
next sidecar (`sidecar_progress`: `eval/sidecar_progress.json`); and which worker of a
sweep runs which trial (`sweep_workers`: the slots of a sweep dir's `workers/`, the takeover
lock, the study database's or a file there, a trial's owner and heartbeat). For object stores: `staging` (a local copy
per process), `background` (uploads off the training thread) and `at_once` (reads that do not
wait for each other).

`from ctl.model_dir import ModelDir` (and the functions of `layout`, `files` and
`checkpoints`) is how the layers above use it.
"""

from ctl.model_dir.at_once import Ahead, at_once
from ctl.model_dir.checkpoints import (CHECKPOINT_STATE_FILE, CheckpointState, Restored, UnreadableCheckpointError,
                                       checkpoint_files, checkpoint_index)
from ctl.model_dir.files import (OBJECT_STORE_SCHEMES, PUBLISHED_MARKER, TEMP_PREFIX, JsonLines, entries,
                                 is_object_store, is_published, is_temporary, publish_directory, publishing,
                                 read_bytes, read_json, read_json_lines, read_text, temporaries, write_atomically,
                                 write_json)
from ctl.model_dir.layout import (CONFIG_FILE, EVAL_DIR, EVALUATOR_FILE, FINISHED_FILE, METRICS_FILE,
                                  OPERATIVE_CONFIG_FILE, RECORD_FIELDS, SIDECAR_METRICS_FILE, TRAIN_DIR, ModelDir,
                                  eval_set_dir, results_of, uploaded_path)

__all__ = [
    "Ahead", "at_once",
    "CHECKPOINT_STATE_FILE", "CheckpointState", "Restored", "UnreadableCheckpointError", "checkpoint_files",
    "checkpoint_index", "OBJECT_STORE_SCHEMES", "PUBLISHED_MARKER", "TEMP_PREFIX", "JsonLines", "entries",
    "is_object_store", "is_published", "is_temporary", "publish_directory", "publishing", "read_bytes",
    "read_json", "read_json_lines", "read_text", "temporaries", "write_atomically", "write_json", "CONFIG_FILE",
    "EVAL_DIR", "EVALUATOR_FILE", "FINISHED_FILE", "METRICS_FILE", "OPERATIVE_CONFIG_FILE", "RECORD_FIELDS",
    "SIDECAR_METRICS_FILE", "TRAIN_DIR", "ModelDir", "eval_set_dir", "results_of", "uploaded_path",
]
