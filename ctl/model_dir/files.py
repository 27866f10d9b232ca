"""Every read and write goes through `tf.io.gfile`, so a model dir may be local,
on NFS or in an object store (`gs://`). Writes are atomic (on a file system a
temporary name, then a rename; in an object store one upload): readers see the
old file or the new one, never half. JSON-lines files are appended one whole
line per write (`JsonLines`, the one writer of both). Directories (exports, the best checkpoint) are written aside
and published whole, their marker last (`publish_directory`). Reads are defensive: a record that cannot be read
(0 bytes, garbage, not UTF-8) is reported in one WARNING and treated as absent;
a JSON-lines file skips a line cut short by a kill.
"""

import contextlib
import fnmatch
import json
import os
import socket
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import tensorflow as tf

from ctl.model_dir import staging
from ctl.model_dir.background import upload, uploads
from ctl.utils import console
from ctl.utils.errors import first_line

OBJECT_STORE_SCHEMES = ("gs", "s3")
PUBLISHED_MARKER = "ctl_published.json"  # In a published directory: written last.
TEMP_PREFIX = ".tmp-"  # A directory being written (`publishing`): `.tmp-<name>-<pid>`.


def is_object_store(path: str) -> bool:
    """Whether `path` lives in an object store (`gs://`, `s3://`): whole objects, no append,
    no atomic rename of a directory, no `flock`.

    Args:
        path: a path or URL.
    """
    return path.split("://", 1)[0] in OBJECT_STORE_SCHEMES if "://" in path else False


def upload_written(remote_dir: str, write: Callable[[str], None]) -> None:
    """In an object store, runs `write(local_dir)` on a new local staging directory, then
    uploads each file it wrote there into `remote_dir` under the same relative path, and removes
    the local copies; elsewhere runs `write(remote_dir)`.

    For a summary written once (a `tf.summary` writer on the store itself makes its event
    file there in several requests, inside TensorFlow ops that hold up the training thread's
    own summary ops meanwhile).

    Args:
        remote_dir: the directory the files belong in.
        write: writes files into the directory it is given.
    """
    if not is_object_store(remote_dir):
        write(remote_dir)
        return
    local = staging.directory("written")
    try:
        write(local)
        for directory, _, names in os.walk(local):
            for name in sorted(names):
                path = os.path.join(directory, name)
                upload(path, os.path.join(remote_dir, os.path.relpath(path, local)))
    finally:
        staging.remove(local)


def write_atomically(path: str, text: Union[str, bytes]) -> None:
    """Writes `text` (or bytes) to `path` so that readers see the old or the new file, never half.

    On a file system: a temporary name, then a rename. In an object store an
    upload is already all or nothing (a rename there is a copy and a delete).

    Args:
        path: the file.
        text: its new contents, text or bytes.
    """
    mode = "wb" if isinstance(text, bytes) else "w"
    if is_object_store(path):
        with tf.io.gfile.GFile(path, mode) as f:
            f.write(text)
        return
    temp = f"{path}.tmp-{os.getpid()}"
    with tf.io.gfile.GFile(temp, mode) as f:
        f.write(text)
    tf.io.gfile.rename(temp, path, overwrite=True)


WHOLE_READ_ATTEMPTS = 5
_READ_CHUNK = 16 << 20


def read_bytes(path: str) -> bytes:
    """The bytes of the file at `path`, all of one version of it.

    An object store replaces an object whole, but `tf.io.gfile`'s `read()` asks for
    as many bytes as its cached size says (TensorFlow caches a `gs://` object's size
    for seconds): after another process rewrote it, that is the new version cut to
    the old length. Asking for a fixed, larger count instead reads what is there, a
    record in one request. "File contents are inconsistent" (the cached size was
    longer) is read again. Raises `tf.errors.NotFoundError` if there is no such file.

    Args:
        path: the file.
    """
    for attempt in range(WHOLE_READ_ATTEMPTS):
        try:
            chunks = []
            with tf.io.gfile.GFile(path, "rb") as f:
                while True:
                    chunks.append(f.read(_READ_CHUNK))
                    if len(chunks[-1]) < _READ_CHUNK:
                        return b"".join(chunks)
        except tf.errors.InternalError:
            if attempt == WHOLE_READ_ATTEMPTS - 1:
                raise
            time.sleep(0.1 * (attempt + 1))
    raise AssertionError("unreachable")


def read_text(path: str) -> Optional[str]:
    """The text at `path`; None if there is no such file. Raises `ValueError`
    (with what is wrong) when it cannot be read as UTF-8 text.

    Args:
        path: the file.
    """
    if not tf.io.gfile.exists(path):
        return None
    try:
        data = read_bytes(path)
    except tf.errors.NotFoundError:
        return None  # Deleted between the two calls.
    except tf.errors.OpError as error:
        raise ValueError(f"cannot read it: {first_line(error)}") from error
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"not UTF-8 text ({error.reason} at byte {error.start})") from error


def read_json(path: str, default: Any = None) -> Any:
    """The JSON value at `path`; `default` when there is none or it cannot be read
    (then with one WARNING: the record is treated as absent).

    Args:
        path: the file.
        default: returned when there is no record or it cannot be read.
    """
    try:
        text = read_text(path)
        if text is None:
            return default
        if not text.strip():
            raise ValueError("the file is empty")
        return json.loads(text)
    except ValueError as error:  # json.JSONDecodeError is one.
        console.warning("files", "ignoring %s: %s", path, error)
        return default


def write_json(path: str, value: Any) -> None:
    """Stores `value` at `path` atomically (creating the directory).

    Args:
        path: the file.
        value: a JSON-serializable value.
    """
    tf.io.gfile.makedirs(os.path.dirname(path))
    write_atomically(path, json.dumps(value))


class JsonLines:
    """Appends records to a JSON-lines file, one whole line per write: the one writer of the run's
    `metrics.jsonl` (`ctl.hooks.progress.MetricsLog`, a line per train loop and evaluation) and
    of the sidecar's `eval/metrics.jsonl` (a line per evaluation). `read_json_lines` reads them.

    On a file system the file stays open between records (opening it per line cost time after
    every train loop: bench/README.md); each line is one flushed write, so readers never see half a
    record and a killed process loses none. The first record mends a last line a kill cut short
    (readers skip that line; the next one starts on a line of its own).

    In an object store an append would upload the whole object again, so the lines are kept in
    memory (read once, at the first record) and the object is written whole. When depends on
    what the record is, the one place the two writers differ:

    - `background=False` (the sidecar): before `append` returns. Its line is what makes an
      evaluation done, and must be in the store before the progress record written after it.
    - `background=True` (a train loop's lines): from `ctl.model_dir.background`, off the
      training thread, one upload queued at a time with every line so far; the file's earlier
      lines are read there too, at the first upload. A SIGKILL loses the lines not yet uploaded.

    Args:
        path: the file (created with its directory on the first record).
        background: in an object store, upload off the caller's thread.
    """

    def __init__(self, path: str, background: bool = False):
        self.path = path
        self.background = background
        self._file: Optional[Any] = None  # A GFile, opened on the first record.
        self._lines: Optional[List[str]] = None  # Object stores: every line of the file.
        self._queued = False
        self._pending: List[str] = []  # Object stores, `background`: lines not yet uploaded.
        self._pending_lock = threading.Lock()

    def append(self, record: Dict[str, Any]) -> None:
        """Appends `record` (a JSON object) as one line.

        Args:
            record: a JSON-serializable dict.
        """
        line = json.dumps(record) + "\n"
        if is_object_store(self.path):
            self._append_in_store(line)
            return
        if self._file is None:
            # tf.io.gfile, for a local path too: with Python's own file, figure 1's MLP ran
            # slower, though a line alone cost less (bench/README.md).
            line = _mend(self.path) + line
            self._file = tf.io.gfile.GFile(self.path, "a")
        self._file.write(line)
        self._file.flush()

    def close(self) -> None:
        """Closes the file (a later record opens it again)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def _append_in_store(self, line: str) -> None:
        if self.background:  # The file's lines are read on the upload's thread too.
            with self._pending_lock:
                self._pending.append(line)
                if self._queued:
                    return
                self._queued = True
            uploads().submit(self._upload, key=self.path)  # Beside other objects.
            return
        self._read_lines()
        self._lines.append(line)
        write_atomically(self.path, "".join(self._lines))

    def _read_lines(self) -> None:
        if self._lines is None:
            text = read_text(self.path) or ""
            self._lines = [text + ("\n" if text and not text.endswith("\n") else "")]

    def _upload(self) -> None:
        self._read_lines()
        with self._pending_lock:  # Lines appended from now on queue the next upload.
            self._queued = False
            self._lines.extend(self._pending)
            self._pending = []
        write_atomically(self.path, "".join(self._lines))


def _mend(path: str) -> str:
    """What goes before the next line of `path`: a newline if a kill cut its last line short."""
    tf.io.gfile.makedirs(os.path.dirname(path))
    if not tf.io.gfile.exists(path):
        return ""
    size = tf.io.gfile.stat(path).length
    if not size:
        return ""
    with tf.io.gfile.GFile(path, "rb") as f:
        f.seek(size - 1)
        return "" if f.read(1) == b"\n" else "\n"


class NewFiles:
    """What a summary writer about to be created in `directory` adds: the directories missing
    on the way to it, and its event files beside those already there (`undo` removes them).
    An event file is this process's by its name (TensorFlow's `<time>.<host>.<pid>.<n>.v2`):
    one another process made there meanwhile (the trainer that holds the model dir, a sidecar
    evaluator) stays.

    Args:
        directory: the writer's directory.
    """

    def __init__(self, directory: str):
        self.directory = directory
        self.missing: List[str] = []
        path = directory
        while path and not tf.io.gfile.exists(path):
            self.missing.append(path)
            parent = os.path.dirname(path)
            path = parent if parent != path else ""
        self.files = set(tf.io.gfile.listdir(directory)) if not self.missing else set()

    def undo(self) -> None:
        if not tf.io.gfile.isdir(self.directory):
            return
        own = f".{socket.gethostname()}.{os.getpid()}."
        for name in tf.io.gfile.listdir(self.directory):
            if name not in self.files and name.startswith("events.out.tfevents.") and own in name:
                tf.io.gfile.remove(os.path.join(self.directory, name))
        for path in self.missing:  # Deepest first, each only if nothing else is in it now.
            if tf.io.gfile.isdir(path) and not tf.io.gfile.listdir(path):
                tf.io.gfile.rmtree(path)


def read_json_lines(path: str) -> List[Dict[str, Any]]:
    """The records of a JSON-lines file, oldest first; a line that cannot be read is skipped.

    Args:
        path: the JSON-lines file (none: no records).
    """
    if not tf.io.gfile.exists(path):
        return []
    data = read_bytes(path)
    records = []
    for line in data.splitlines():
        try:
            record = json.loads(line.decode("utf-8"))
        except ValueError:  # Cut short by a kill, or damaged.
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


# Directories written elsewhere and published whole.


def publish_directory(temp: str, final: str, last: Sequence[str] = ()) -> None:
    """Puts the finished directory `temp` at `final` so that readers see all of it or nothing.

    Readers trust `final` once `is_published(final)`: its marker
    (`PUBLISHED_MARKER`) is written last. On a file system the marker is written
    into `temp`, which is then renamed into place (atomic). In an object store,
    where renaming a directory copies each object, the objects are copied one
    by one, those whose names match a pattern of `last` (what other readers
    look for, e.g. `saved_model.pb` or `*.index`) after all others, then the
    marker, and `temp` is deleted. A half `final` that an interrupted publish
    left (no marker) is replaced.

    Args:
        temp: the finished directory.
        final: where it is published.
        last: name patterns copied after all other files (in an object store).
    """
    if tf.io.gfile.exists(final):
        tf.io.gfile.rmtree(final)
    marker = {"published": time.time(), "host": socket.gethostname(), "pid": os.getpid()}
    if not is_object_store(final):
        write_atomically(os.path.join(temp, PUBLISHED_MARKER), json.dumps(marker) + "\n")
        tf.io.gfile.rename(temp, final)
        return
    files = []
    for directory, _, names in tf.io.gfile.walk(temp):
        files += [os.path.join(directory, name) for name in names]
    files.sort(key=lambda path: any(fnmatch.fnmatch(os.path.basename(path), pattern)
                                    for pattern in last))  # Stable: the `last` ones at the end.
    for path in files:
        target = os.path.join(final, os.path.relpath(path, temp))
        tf.io.gfile.makedirs(os.path.dirname(target))
        tf.io.gfile.copy(path, target, overwrite=True)
    write_atomically(os.path.join(final, PUBLISHED_MARKER), json.dumps(marker) + "\n")
    tf.io.gfile.rmtree(temp)


@contextlib.contextmanager
def publishing(final: str, last: Sequence[str] = ()) -> Iterator[str]:
    """The temporary directory to write `final` into, published whole when the block ends.

        with publishing(export_dir, last=["saved_model.pb"]) as temp:
            tf.saved_model.save(module, temp)

    The temporary is `.tmp-<name>-<pid>` beside `final` (a leftover of this
    name is removed first); an error in the block leaves it for the owner's
    cleanup (`is_temporary`) and `final` untouched.

    Args:
        final: where the directory is published.
        last: name patterns published after all other files (`publish_directory`).
    """
    parent = os.path.dirname(final)
    tf.io.gfile.makedirs(parent)
    temp = os.path.join(parent, f"{TEMP_PREFIX}{os.path.basename(final)}-{os.getpid()}")
    if tf.io.gfile.exists(temp):
        tf.io.gfile.rmtree(temp)
    yield temp
    publish_directory(temp, final, last)


def is_temporary(name: str) -> bool:
    """Whether `name` (in a directory of published ones) is a `publishing` temporary.

    Args:
        name: an entry's name.
    """
    return name.startswith(TEMP_PREFIX)


def entries(directory: str) -> List[Tuple[str, str]]:
    """`(name, path)` of each entry of `directory`, in listing order.

    Args:
        directory: a directory (local or in an object store).
    """
    names = [name.rstrip("/") for name in tf.io.gfile.listdir(directory)]
    return [(name, os.path.join(directory, name)) for name in names]


def temporaries(directory: str) -> List[str]:
    """The `publishing` temporaries in `directory` (a writer killed meanwhile left them).

    Args:
        directory: a directory of published ones.
    """
    return [path for name, path in entries(directory) if is_temporary(name)]


def is_published(path: str) -> bool:
    """Whether the directory `path` was published whole (`publish_directory`).

    Args:
        path: a directory.
    """
    return tf.io.gfile.exists(os.path.join(path, PUBLISHED_MARKER))
