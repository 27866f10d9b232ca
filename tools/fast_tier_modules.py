"""Which modules of ctl/ the fast tier (`pytest -m "not slow"`) leaves unexercised.

    python tools/fast_tier_modules.py [PYTEST ARGS]    # default: -n 2

Runs the fast tier with `tests/support/module_use.py` (every call into ctl/ traced, so slower
than the tier alone), then prints each module of ctl/ that defines a function none of the fast
tests ran, and exits 1 if there is any (or with pytest's status, if a test failed). A module
that only imports or defines constants is used once imported. BUILD.md's "Testing" says why.
"""

import ast
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def modules_with_functions():
    """ctl's source files (relative to the checkout) that define a function or a method."""
    found = []
    for directory, unused_dirs, files in os.walk(os.path.join(ROOT, "ctl")):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                with open(path) as f:
                    tree = ast.parse(f.read())
                if any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                       for node in ast.walk(tree)):
                    found.append(os.path.relpath(path, ROOT))
    return sorted(found)


def main(pytest_args):
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "CTL_MODULE_USE_DIR": out, "PYTHONPATH": ROOT}
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "not slow",
                               "-p", "tests.support.module_use", *(pytest_args or ["-n", "2"])],
                              cwd=ROOT, env=env)
        used = set()
        for name in os.listdir(out):
            with open(os.path.join(out, name)) as f:
                used.update(json.load(f))
    missing = [path for path in modules_with_functions() if path not in used]
    print(f"fast tier: exit {done.returncode} in {time.monotonic() - started:.0f} s; "
          f"{len(used)} of ctl's modules with functions exercised, {len(missing)} not:")
    for path in missing:
        print(f"  {path}")
    return done.returncode or (1 if missing else 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
