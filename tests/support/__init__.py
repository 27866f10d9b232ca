"""What the tests share, one idea a module; no test module imports another.

- `env`: where the checkout is (`ROOT`), the test gin files, and the environment of every process a test
  starts (`ctl_env`).
- `processes`: commands (`ctl_command`, `python_command`), one-shot runs (`run`, `run_ctl`), and `Process`,
  the one wrapper of a process started in the background (bounded waits, output read as it comes, killed
  with its whole session on the way out).
- `in_process`: `python -m ctl.run` as `main` in the test's own process (`run_ctl_in_process`).
- `reading`: what a run wrote and said (summaries, checkpoints, file hashes, exports, ctl's stderr lines).
- `probe`: trainer processes of tests/faults.gin (ProbeTask) followed by their progress file, and the
  SIGKILL chaos run beside an uninterrupted one.
- `trained`: the `trained_dir` fixture, finished runs of tests/regression.gin made once per test process.
- `strategies`: the test process's two CPU devices and its one MirroredStrategy.
"""
