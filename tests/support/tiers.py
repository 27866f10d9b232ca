"""The fast tier (`pytest -m "not slow"`): what a test not marked `slow` may start.

A contributor runs the fast tier on every change, so it starts no Python process but the cheap
ones below: no `python -m ctl.*`, no `python -c` that imports ctl or TensorFlow (each costs
seconds of imports, and a run tens), no mypy. `tests/conftest.py` fails a test not marked
`slow` that starts any other Python process, naming the command.
"""

import os
import sys
from typing import Sequence

# `python -m MODULE` that a fast test may start: each answers in well under a second (the GCS
# emulator imports no TensorFlow; ruff is a binary).
CHEAP_MODULES = ("ruff", "tests.gcs.emulator")
# `python -c CODE` that a fast test may start, by the code's start: import-linter (under a
# second: it parses ctl/, imports none of it).
CHEAP_CODE = ("import sys; from importlinter.cli import ",)


def _is_python(program: str) -> bool:
    name = os.path.basename(program)
    return (os.path.realpath(program) == os.path.realpath(sys.executable)
            or name.startswith("python"))


def expensive_python(command) -> bool:
    """Whether `command` (a `subprocess.Popen` argument) starts a Python process the fast tier
    may not: anything but `python -m` one of `CHEAP_MODULES` or `python -c` one of `CHEAP_CODE`.

    Args:
      command: the argument list (or string) given to `subprocess.Popen`.
    """
    if isinstance(command, (str, bytes, os.PathLike)):
        args: Sequence[str] = [os.fsdecode(command)]
    else:
        args = [os.fsdecode(a) for a in command]
    if not args or not _is_python(args[0].split()[0]):
        return False
    rest = args[1:]
    if len(rest) >= 2 and rest[0] == "-m":
        return rest[1] not in CHEAP_MODULES
    if len(rest) >= 2 and rest[0] == "-c":
        return not rest[1].startswith(CHEAP_CODE)
    return True
