"""Which of ctl's modules a test run exercises: a pytest plugin for tools/fast_tier_modules.py.

With `-p tests.support.module_use` and CTL_MODULE_USE_DIR set, each test process records the
source file of every function of ctl/ that runs in it (a call traced by `sys.settrace`, in every
thread; code that runs at import, a module's or a class's body, is not a use), and writes them
to CTL_MODULE_USE_DIR/<process id>.json at its end. The tracing makes the run slower: it is
for the check, not for every run.
"""

import inspect
import json
import os
import sys
import threading

from tests.support.env import ROOT

CTL_DIR = os.path.join(ROOT, "ctl") + os.sep
_USED = set()
_SEEN_CODE = set()


def _trace(frame, unused_event, unused_arg):
    code = frame.f_code
    if code not in _SEEN_CODE:
        _SEEN_CODE.add(code)
        if code.co_filename.startswith(CTL_DIR) and code.co_flags & inspect.CO_NEWLOCALS:
            _USED.add(os.path.relpath(code.co_filename, ROOT))
    return None  # No line events: calls only.


def pytest_configure(config):
    if os.environ.get("CTL_MODULE_USE_DIR"):
        threading.settrace(_trace)
        sys.settrace(_trace)


def pytest_unconfigure(config):
    out = os.environ.get("CTL_MODULE_USE_DIR")
    if not out:
        return
    sys.settrace(None)
    threading.settrace(None)  # type: ignore[arg-type]
    with open(os.path.join(out, f"{os.getpid()}.json"), "w") as f:
        json.dump(sorted(_USED), f)
