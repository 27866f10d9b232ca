"""Starting processes as a user would: `python -m ctl.run ...` and the like, every wait bounded."""

import codecs
import fcntl
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time

from tests.support.env import ROOT, ctl_env


def ctl_command(*args, module="ctl.run", wrapper=()):
    """`python -m module args` (under the command `wrapper`, if any)."""
    return [*wrapper, sys.executable, "-m", module, *args]


def python_command(code):
    """`python -c code`."""
    return [sys.executable, "-c", code]


def run(command, timeout=300, env=None):
    """Runs `command` in the checkout with `ctl_env(env)`; returns the CompletedProcess (text)."""
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=ctl_env(env))


def run_ctl(*args, module="ctl.run", timeout=300, env=None, wrapper=()):
    """Runs ctl.run (or another of ctl's modules) with `args` (under the command `wrapper`, if
    any); returns the CompletedProcess (text)."""
    return run(ctl_command(*args, module=module, wrapper=wrapper), timeout=timeout, env=env)


def wait_for_file(path, timeout=240, poll_s=0.01):
    """Waits until `path` exists (a test's signal to a process it started, or the process's to the
    test); TimeoutError after `timeout` seconds.

    Args:
        path: the file waited for.
        timeout: seconds to wait at most.
        poll_s: seconds between looks.
    """
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear in {timeout} s")
        time.sleep(poll_s)


class _Output:
    """What one of a process's streams said, read on a thread as it comes: the text, and each
    line with the time (time.monotonic) it arrived."""

    def __init__(self, fd):
        self.chunks, self.lines = [], []
        self._thread = threading.Thread(target=self._read, args=(fd,), daemon=True)
        self._thread.start()

    def _read(self, fd):
        decoder, partial = codecs.getincrementaldecoder("utf-8")("replace"), ""
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:  # A terminal whose last writer closed it.
                data = b""
            text = decoder.decode(data, final=not data)
            self.chunks.append(text)
            *whole, partial = (partial + text).split("\n")
            self.lines.extend((time.monotonic(), line) for line in whole)
            if not data:
                break
        if partial:
            self.lines.append((time.monotonic(), partial))
        os.close(fd)

    def text(self):
        return "".join(self.chunks)

    def join(self, timeout=30):
        self._thread.join(timeout)
        return not self._thread.is_alive()


class Process:
    """A command started in the background in the checkout, in a session of its own.

    Its stdout and stderr (`merge_stderr`: both in stdout) are read as they come (`stdout()`,
    `stderr()`, `lines`). `stdin=True`: a pipe to write to (`write_line`); `terminal=columns`:
    stdin, stdout and stderr are a pseudo-terminal that wide (stdout() is what it showed).
    Every wait is bounded; used as a context manager, the process and whatever it started in
    its session are killed on the way out (SIGKILL, if they still run).
    """

    def __init__(self, command, env=None, merge_stderr=False, stdin=False, terminal=None):
        env = ctl_env(env)
        if terminal:
            master, slave = pty.openpty()
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, terminal, 0, 0))
            env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
            self.proc = subprocess.Popen(command, cwd=ROOT, stdin=slave, stdout=slave, stderr=slave,
                                         env=env, start_new_session=True)
            os.close(slave)
            self._out, self._err = _Output(master), None
            return
        self.proc = subprocess.Popen(
            command, cwd=ROOT, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            env=env, start_new_session=True)
        self._out = _Output(os.dup(self.proc.stdout.fileno()))
        self._err = None if merge_stderr else _Output(os.dup(self.proc.stderr.fileno()))
        self.proc.stdout.close()
        if self.proc.stderr:
            self.proc.stderr.close()

    @classmethod
    def ctl(cls, *args, module="ctl.run", **kwargs):
        """`python -m ctl.run args` (or another of ctl's modules) in the background."""
        return cls(ctl_command(*args, module=module), **kwargs)

    def __enter__(self):
        return self

    def __exit__(self, *unused_exc_info):
        self.kill()

    @property
    def pid(self):
        return self.proc.pid

    @property
    def returncode(self):
        return self.proc.returncode

    @property
    def lines(self):
        """stdout's lines so far, each as (arrival time, line)."""
        return list(self._out.lines)

    def stdout(self):
        return self._out.text()

    def stderr(self):
        return self._err.text() if self._err else ""

    def write_line(self, line):
        self.proc.stdin.write(f"{line}\n".encode())
        self.proc.stdin.flush()

    def send_signal(self, signum):
        self.proc.send_signal(signum)

    def poll(self):
        return self.proc.poll()

    def wait(self, timeout):
        """Waits up to `timeout` seconds for the process to end; returns its status."""
        status = self.proc.wait(timeout=timeout)
        self._out.join()
        if self._err:
            self._err.join()
        return status

    def wait_until(self, condition, timeout=120, poll_s=0.02):
        """Waits until `condition()` holds, looking every `poll_s` seconds (longer for a
        bucket: each look is a request); False if the process ended first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return True
            if self.proc.poll() is not None:
                self._out.join(timeout=10)  # Its last words.
                return condition()
            time.sleep(poll_s)
        raise TimeoutError(f"not reached in {timeout} s; stdout: {self.stdout()[-2000:]}")

    def wait_for_output(self, text, timeout=60):
        """Waits until the process has printed `text` on stdout."""
        if not self.wait_until(lambda: text in self.stdout(), timeout):
            raise AssertionError(f"the process ended without printing {text!r}; stdout: "
                                 f"{self.stdout()[-2000:]} stderr: {self.stderr()[-2000:]}")

    def wait_for_line(self, pattern, timeout=120, after=0):
        """The first stdout line from index `after` that matches `pattern`: (index, arrival
        time, match)."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = self.lines
            for index in range(after, len(lines)):
                match = regex.search(lines[index][1])
                if match:
                    return index, lines[index][0], match
            if self.proc.poll() is not None and self._out.join(timeout=0) and len(lines) == len(self.lines):
                break
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r}; stdout:\n{self.stdout()[-6000:]}")

    def finish(self, timeout=180):
        """Waits for the process to end (killed after `timeout` seconds); returns the
        CompletedProcess (text)."""
        try:
            self.proc.wait(timeout=timeout)
        finally:
            self.kill()
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, self.stdout(),
                                           self.stderr())

    def kill(self):
        """SIGKILL to the process's session (whatever it started too), then its output read to the end."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(timeout=60)
        for output in (self._out, self._err):
            if output:
                output.join()
        if self.proc.stdin:
            self.proc.stdin.close()
