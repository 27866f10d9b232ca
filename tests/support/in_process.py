"""`python -m ctl.run ARGS` as `main` in the test's own process, where TensorFlow is imported
already: its exit status, stdout and stderr (gin and absl's flags cleared after)."""

import contextlib
import io
import os
import subprocess
from typing import Dict, List, Optional, Tuple

from absl import app
from absl import flags as absl_flags
from absl import logging as absl_logging
import gin


def run_ctl_in_process(args: List[str], env: Optional[Dict[str, str]] = None
                       ) -> Tuple[int, str, str]:
    """Runs `ctl.run`'s `main` on `args` with `env` on top of os.environ: (exit status, stdout,
    stderr)."""
    from ctl import run as run_module
    absl_flags.FLAGS.unparse_flags()
    handler = absl_logging.get_absl_handler().python_handler
    stream = handler.stream
    out, err = io.StringIO(), io.StringIO()
    saved_env = {name: os.environ.get(name) for name in (env or {})}
    os.environ.update(env or {})
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            app.run(run_module.main, argv=["ctl.run", *args], flags_parser=run_module.parse_flags)
    except SystemExit as exit_:
        code = 0 if exit_.code is None else exit_.code
    finally:
        handler.stream = stream
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        absl_flags.FLAGS.unparse_flags()
        gin.clear_config()
    return code, out.getvalue(), err.getvalue()


def ctl_in_process(*args: str, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """`run_ctl_in_process` as `tests.support.processes.run_ctl` returns a process's end: a
    `subprocess.CompletedProcess` (returncode, stdout, stderr), for a test that runs the command's
    main here instead of paying a process's TensorFlow import."""
    code, out, err = run_ctl_in_process(list(args), env)
    return subprocess.CompletedProcess(list(args), code, out, err)
