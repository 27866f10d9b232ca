"""A warm launcher: one process per worker that has imported TensorFlow and ctl, and forks each trial.

A trial in a process of its own pays TensorFlow's import (3.1 s of a digits
trial's 5.9 s on the 2-core host, bench/README.md, figure 12) before it trains.
The launcher pays it once: started by its worker (`Launcher`), it imports
TensorFlow and ctl's modules, and no more: no op runs, no device is listed,
no eager context exists (no thread started since the imports: `serve`
checks it before each fork), no flag is
parsed, no gin file is read. For each trial it forks a child, which

- is a process of its own, killed with the launcher (`PR_SET_PDEATHSIG`),
  which is killed with its worker: kill -9 of a worker ends its trial, as it
  did when the worker started the trial itself;
- is a session of its own (`setsid`), so that a terminal's Ctrl-C (SIGINT to
  the foreground process group) or a SIGTERM to the sweep's group reaches only
  its worker, which passes one SIGTERM on: a trial that got the signal from
  both would take the worker's as a second signal and exit at once, without a
  checkpoint (`ctl.core.stop`); it has the default SIGTERM and SIGINT (the
  launcher ignores them);
- writes its stdout and stderr to the trial's log, reads nothing;
- reseeds the global random generators the fork would share (NumPy's;
  Python's `random` reseeds itself in a forked child);
- runs `python -m ctl.run ...` as `__main__` (`runpy`) with the trial's argv:
  absl parses its flags anew, gin parses its files, TensorFlow starts its
  runtime, all in the child; it exits like that command, with its status,
  after its exit handlers (`ctl.utils.process_end`, registered first in the
  launcher, so that the handlers of the modules imported here run before it).

The launcher reports each child's pid, then its exit status (as `Popen`'s
`returncode`: negative for a signal). It ends when its worker closes its stdin.
`--fork_trials=false` on `python -m ctl.sweep` starts each trial with
`subprocess` instead (`Launcher(fork=False)`), the launcher's fallback.
"""

import ctypes
import json
import os
import select
import signal
import subprocess
import sys
from typing import List, Optional

from ctl.utils import process_end

FORKS = sys.platform.startswith("linux")  # Elsewhere, no `PR_SET_PDEATHSIG`: a process per trial.


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """In a child, before it runs its program: `signum` reaches it when its parent dies (Linux).

    Args:
        signum: the signal the child gets.
    """
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signum)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # Not Linux: the child outlives a killed worker, and its trainer.lock says so.


class Forked:
    """A forked trial, as much of `subprocess.Popen` as the runner uses.

    Args:
        launcher: the launcher that forked it (and reaps it).
        pid: the child's process id.
    """

    def __init__(self, launcher: "Launcher", pid: int):
        self.pid, self.returncode, self._launcher = pid, None, launcher

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            reply = self._launcher.reply(timeout=0)
            if reply is not None:
                self.returncode = reply["status"]
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        """The exit status; `subprocess.TimeoutExpired` if it has none within `timeout`.

        Args:
            timeout: seconds to wait (None: no limit).
        """
        if self.returncode is None:
            reply = self._launcher.reply(timeout=timeout)
            if reply is None:
                raise subprocess.TimeoutExpired(f"trial pid {self.pid}", timeout)
            self.returncode = reply["status"]
        return self.returncode

    def send_signal(self, signum: int) -> None:
        """Sends `signum` to the trial, unless it has ended.

        Args:
            signum: the signal.
        """
        if self.poll() is None:
            os.kill(self.pid, signum)  # A zombie until the launcher reaps it: never another process.


class Launcher:
    """The worker's side: starts the launcher process once, then a trial at a time through it.

    Args:
        fork: fork each trial from the warm launcher process; False starts each in a new process.
    """

    def __init__(self, fork: bool = FORKS):
        self.fork = fork
        self._process: Optional[subprocess.Popen] = None
        self._buffer = b""

    def start(self, argv: List[str], log_path: str):
        """Starts `argv` (`[python, "-m", module, ...]`) with its output to `log_path`.

        Args:
            argv: the trial's command line.
            log_path: the file its output goes to.

        Returns:
            A `Forked` (or a `subprocess.Popen` without `fork`).
        """
        if not self.fork:
            with open(log_path, "a") as log:
                return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                        preexec_fn=die_with_parent, start_new_session=True)
        if self._process is None or self._process.poll() is not None:
            self._buffer = b""
            self._process = subprocess.Popen(
                [sys.executable, "-m", "ctl.sweep.launcher"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, preexec_fn=die_with_parent)
        request = json.dumps({"argv": argv[1:], "log": os.path.abspath(log_path)}) + "\n"
        self._process.stdin.write(request.encode())
        self._process.stdin.flush()
        return Forked(self, self.reply(timeout=None)["pid"])

    def reply(self, timeout: Optional[float]) -> Optional[dict]:
        """The launcher's next line (None if none within `timeout`).

        Args:
            timeout: seconds to wait (0: do not wait; None: no limit).
        """
        fd = self._process.stdout.fileno()
        while b"\n" not in self._buffer:
            if not select.select([fd], [], [], timeout)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError(f"the trial launcher ended (status {self._process.wait()}); "
                                   "its worker's output says why")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        if self._process is not None:
            self._process.stdin.close()
            self._process.wait()
            self._process = None


def warm() -> None:
    """Imports what `ctl.run` imports before it trains: TensorFlow, ctl and its API."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # As ctl.run sets it, before the import.
    from ctl.utils import devices

    devices.list_devices()  # TensorFlow, without the cuInit line (the forked trials inherit it).
    import ctl
    from ctl import smoke, train_lib  # noqa: F401
    from ctl.cluster import distribute, peers  # noqa: F401
    from ctl.faults import preemption, storage  # noqa: F401
    from ctl.sidecar import continuous_eval  # noqa: F401
    from ctl.sweep import pruning  # noqa: F401 - the trials' hook, and Optuna (never a module defining flags).

    ctl.import_api()


def threads() -> int:
    """The process's threads. TensorFlow's runtime starts thread pools: after the imports, a
    launcher whose count grew has started something that a fork would copy half of."""
    return len(os.listdir("/proc/self/task"))


def serve() -> None:
    """The launcher process: forks a child per request line on stdin; replies on stdout."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # What the imports print goes to the worker's stderr, never into the replies.
    warm()
    launcher_pid, warm_threads = os.getpid(), threads()
    for line in sys.stdin:
        request = json.loads(line)
        if threads() > warm_threads:  # Fewer: OpenBLAS ends its pool before a fork.
            raise RuntimeError(f"the trial launcher has {threads()} threads, more than the "
                               f"{warm_threads} of its imports: forking it is unsafe")
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            replies.close()
            _run_child(request, launcher_pid)  # Exits the child; never returns.
        replies.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n")


def _run_child(request: dict, launcher_pid: int) -> None:
    try:
        die_with_parent()
        if os.getppid() != launcher_pid:
            os._exit(1)  # The launcher died between the fork and the line above.
        os.setsid()  # A terminal's Ctrl-C reaches its worker only, which stops it once.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()  # Fresh entropy, as a new process has.
        argv = request["argv"]
        if argv[:1] != ["-m"] or len(argv) < 2:
            raise ValueError(f"the launcher runs `-m MODULE ...`, not {argv}")
        sys.argv = [argv[1], *argv[2:]]
    except BaseException as error:  # The child must never return into the loop.
        os.write(2, f"trial launcher: cannot start the trial: {error}\n".encode())
        os._exit(1)
    import runpy

    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    sys.exit(0)  # The interpreter's end: the exit handlers, then `process_end`'s status.


if __name__ == "__main__":
    process_end.end_after_exit_handlers()  # Before the imports: the children's handlers run first.
    serve()
