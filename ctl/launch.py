"""`python -m ctl.launch`: a cluster of `ctl.run` processes on this machine.

    python -m ctl.launch --workers=2 --evaluator -- \\
        --mode=train_and_eval --strategy=multi_worker_mirrored \\
        --model_dir=/tmp/digits --gin_file=configs/digits.gin

starts one `python -m ctl.run <args>` per task on 127.0.0.1, each on a free
port with its own TF_CONFIG, as a cluster manager would on several hosts:

    --workers=N            N workers; worker 0 is the chief.
    --workers=N --ps=M     a chief (the coordinator), N workers and M ps tasks
                           (use --strategy=parameter_server).
    --evaluator            one evaluator task (runs --mode=continuous_eval).
    --restarts=N           restart lost tasks, at most N times in all, as a
                           cluster manager's restart policy would: a task that
                           exits 75 (preempted), 69 (lost a peer) or is killed by
                           a signal (see `Cluster.restart_group` for which
                           tasks restart with it).

Every output line is prefixed with its task ("[worker 1] ..."). The launcher
returns when the tasks that finish on their own (chief, multi-worker workers,
evaluator) have finished, then stops the servers (ps, and the workers of
parameter-server training). If a task fails (and is not restarted), or on
Ctrl-C, it stops them all and exits with the failed task's status (130 on
Ctrl-C).
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence

_STOP_GRACE_S = 10.0
# How long the tasks restarted with a lost one may take to notice the loss and exit.
_GROUP_EXIT_S = 60.0
# The exit statuses of ctl.run that a restart resolves: preempted after a
# checkpoint, and a multi-worker peer lost (`ctl.core.stop`, `ctl.cluster.peers`).
RESTARTABLE = (75, 69)
_KILLED = (signal.SIGKILL, signal.SIGTERM)


def free_ports(count: int) -> List[int]:
    """`count` distinct ports that are free on 127.0.0.1 right now.

    Args:
        count: how many ports.
    """
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def local_cluster(workers: int, ps: int = 0, evaluator: bool = False) -> Dict[str, List[str]]:
    """A cluster spec on 127.0.0.1; with `ps`, a chief coordinates the workers.

    Args:
        workers: worker tasks.
        ps: parameter-server tasks (0: none; any adds a chief).
        evaluator: add an evaluator task.
    """
    if workers < 1 or ps < 0:
        raise ValueError(f"--workers ({workers}) must be >= 1 and --ps ({ps}) >= 0.")
    counts = {"chief": 1 if ps else 0, "worker": workers, "ps": ps, "evaluator": int(evaluator)}
    ports = iter(free_ports(sum(counts.values())))
    return {job: [f"127.0.0.1:{next(ports)}" for _ in range(n)] for job, n in counts.items() if n}


def tf_configs(cluster: Dict[str, List[str]]) -> Dict[str, str]:
    """Maps a task name ("worker 1") to its TF_CONFIG.

    Args:
        cluster: the cluster spec (`local_cluster`).
    """
    return {
        _name(job, index, len(tasks)): json.dumps(
            {"cluster": cluster, "task": {"type": job, "index": index}})
        for job, tasks in cluster.items()
        for index in range(len(tasks))
    }


def _name(job: str, index: int, count: int) -> str:
    return job if job in ("chief", "evaluator") and count == 1 else f"{job} {index}"


class Cluster:
    """The processes of a local cluster; `wait()` returns the exit status.

    With `restarts`, a task lost for a reason a restart can fix is started
    again, as a cluster manager would (at most `restarts` times in all):
    preempted (75), its peer lost (69) or killed by a signal. What is
    restarted follows what TensorFlow can rejoin (see `restart_group`).
    """

    def __init__(self, run_args: Sequence[str], workers: int, ps: int = 0,
                 evaluator: bool = False, out=None, command: Sequence[str] = (),
                 restarts: int = 0):
        """Starts `command + run_args` (default `python -m ctl.run`) once per task.

        Args:
            run_args: the `ctl.run` flags every task gets.
            workers: worker tasks.
            ps: parameter-server tasks (any adds a chief).
            evaluator: add an evaluator task.
            out: where the tasks' prefixed lines go (default: stdout).
            command: the program each task runs (default: `python -m ctl.run`).
            restarts: restarts of lost tasks allowed in all (0: none).
        """
        self._out = out or sys.stdout
        self._lock = threading.Lock()
        self._command = [*(command or (sys.executable, "-m", "ctl.run")), *run_args]
        self.spec = local_cluster(workers, ps, evaluator)
        self._configs = tf_configs(self.spec)
        self._parameter_servers = bool(ps)
        # Under parameter servers, workers and ps serve until stopped.
        self._servers = {"ps", "worker"} if ps else set()
        self.restarts_left = restarts
        self.processes: Dict[str, subprocess.Popen] = {}
        self.errors: Dict[str, str] = {}  # Each task's last `ctl.run: ...` line.
        self._readers: Dict[str, threading.Thread] = {}
        self._threads = []
        for name in self._configs:
            self._start(name)

    def _start(self, name: str) -> None:
        env = {**os.environ, "TF_CONFIG": self._configs[name], "PYTHONUNBUFFERED": "1"}
        process = subprocess.Popen(self._command, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, bufsize=1)
        self.processes[name] = process
        self._say(f"started {name} (pid {process.pid})")
        thread = threading.Thread(target=self._stream, args=(name, process), daemon=True)
        thread.start()
        self._threads.append(thread)
        self._readers[name] = thread

    def _stream(self, name: str, process: subprocess.Popen) -> None:
        for line in process.stdout:
            if line.startswith("ctl.run: "):
                self.errors[name] = line.strip()
            with self._lock:
                self._out.write(f"[{name}] {line}")
                self._out.flush()

    def _finishes(self, name: str) -> bool:
        return name.split(" ")[0] not in self._servers

    def restart_group(self, name: str) -> List[str]:
        """The tasks to restart together when `name` is lost.

        Multi-worker mirrored: every worker (they train in lockstep and re-form
        the collective group together). Parameter servers: a worker alone (the
        coordinator reschedules its steps and it rejoins); the chief or a ps,
        every training task (the variables live on the ps, the coordinator
        builds them). An evaluator: itself.

        Args:
            name: the lost task, e.g. "worker 1".
        """
        job = name.split(" ")[0]
        if job == "evaluator":
            return [name]
        if self._parameter_servers and job == "worker":
            return [name]
        return [n for n in self.processes if n.split(" ")[0] != "evaluator"]

    def wait(self, timeout: Optional[float] = None) -> int:
        """Waits for the finishing tasks (restarting lost ones); stops everything; returns the exit status.

        Args:
            timeout: seconds before every task is stopped (exit status 124); None: no limit.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        status = 0
        try:
            while True:
                codes = {name: p.poll() for name, p in self.processes.items()}
                failed = [name for name, code in codes.items() if code not in (None, 0)]
                if failed:
                    name = failed[0]
                    if not (self.restarts_left and restartable(codes[name])):
                        self._say(f"{name} exited with status {codes[name]}; stopping all tasks.")
                        status = codes[name]
                        self._readers[name].join(timeout=10)  # Its last lines, read.
                        why = self.errors.get(name, "see its lines above")
                        print(f"ctl.launch: error: {name} exited with status {status}: {why}",
                              file=sys.stderr, flush=True)
                        break
                    self._restart(name, codes[name])
                    continue
                if all(codes[name] == 0 for name in codes if self._finishes(name)):
                    break
                if deadline is not None and time.monotonic() > deadline:
                    self._say(f"timed out after {timeout:.0f}s; stopping all tasks.")
                    status = 124
                    break
                time.sleep(0.2)
        except KeyboardInterrupt:
            self._say("interrupted; stopping all tasks.")
            status = 130
        finally:
            self.stop()
        return status

    def _restart(self, name: str, code: int) -> None:
        group = self.restart_group(name)
        self.restarts_left -= 1
        self._say(f"{name} exited with status {code}; restarting {', '.join(group)} "
                  f"({self.restarts_left} restart(s) left).")
        # The others that finish by themselves (multi-worker workers, a PS chief)
        # notice the loss and exit (75 or 69) within TensorFlow's bound; servers,
        # and whatever still runs after that bound, are stopped.
        others = [self.processes[n] for n in group if n != name]
        finishing = [self.processes[n] for n in group if n != name and self._finishes(n)]
        deadline = time.monotonic() + _GROUP_EXIT_S
        while any(p.poll() is None for p in finishing) and time.monotonic() < deadline:
            time.sleep(0.2)
        self._terminate([p for p in others if p.poll() is None])
        for other in group:
            self._start(other)

    def stop(self) -> None:
        """Terminates every task still running (SIGTERM, then SIGKILL after a grace period)."""
        self._terminate([p for p in self.processes.values() if p.poll() is None])
        for thread in self._threads:
            thread.join(timeout=5)

    @staticmethod
    def _terminate(running: List[subprocess.Popen]) -> None:
        for process in running:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE_S
        for process in running:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _say(self, message: str) -> None:
        with self._lock:
            self._out.write(f"[launch] {message}\n")
            self._out.flush()


def restartable(status: int) -> bool:
    """Whether a task that exited with `status` may be restarted: preempted, lost a peer, or killed.

    Killed: by SIGKILL (`kill -9`, the OOM killer) or SIGTERM (a second one
    ends ctl.run at once), as Popen reports it (-N) or a shell does (128 + N).

    Args:
        status: the exit status (negative: killed by that signal, as Popen reports it).
    """
    return status in RESTARTABLE or -status in _KILLED or status - 128 in _KILLED


def _interrupt(signum, frame):
    raise KeyboardInterrupt


class _ArgumentParser(argparse.ArgumentParser):
    """argparse, with a mistake said in one line (`ctl.launch: error: ...`), exit 2."""

    def error(self, message):
        self.exit(2, f"ctl.launch: error: {message.rstrip('.')}; see --help.\n")


def main(argv: Sequence[str]) -> int:
    """`python -m ctl.launch`: starts the local cluster and waits for it.

    Args:
        argv: the arguments after the program name: ctl.launch's own, then `--` and the ctl.run flags.

    Returns:
        The exit status (the cluster's, or 124 after `--timeout_s`).
    """
    parser = _ArgumentParser(
        prog="python -m ctl.launch",
        usage="python -m ctl.launch --workers=N [--ps=M] [--evaluator] -- <ctl.run flags>",
        description="Starts a local cluster of ctl.run processes on 127.0.0.1.",
    )
    parser.add_argument("--workers", type=int, default=2, help="worker tasks (default 2)")
    parser.add_argument("--ps", type=int, default=0, help="parameter-server tasks; adds a chief")
    parser.add_argument("--evaluator", action="store_true", help="add an evaluator task")
    parser.add_argument("--restarts", type=int, default=0,
                        help="restart lost tasks (exit 75, 69 or killed by a signal) at most N times in all")
    parser.add_argument("--timeout_s", type=float, default=None,
                        help="stop every task after this many seconds (exit 124)")
    if "--" in argv:
        split = list(argv).index("--")
        ours, run_args = list(argv[:split]), list(argv[split + 1:])
    else:
        ours, run_args = list(argv), []
    args = parser.parse_args(ours)
    if args.workers < 1 or args.ps < 0 or args.restarts < 0:
        parser.error(f"--workers ({args.workers}) must be >= 1, --ps ({args.ps}) and "
                     f"--restarts ({args.restarts}) >= 0.")
    if not run_args:
        parser.error("give the ctl.run flags after `--`, e.g. -- --mode=train --model_dir=...")
    signal.signal(signal.SIGTERM, _interrupt)  # Stopped by a supervisor: stop the tasks too.
    cluster = Cluster(run_args, args.workers, args.ps, args.evaluator, restarts=args.restarts)
    print(f"[launch] cluster: {json.dumps(cluster.spec)}", flush=True)
    status = cluster.wait(args.timeout_s)
    return status if status >= 0 else 128 - status  # Killed by signal N: 128 + N, as a shell says.


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
