"""The docs' `python -m ctl.run` commands, checked by ctl's own parsers (run by tests/test_docs.py).

    python -m tests.docs_commands < commands.json   # in a page's work dir; prints the problems as JSON
    python -m tests.docs_commands --serve           # a page per line: {"workdir": ..., "commands": [...]}

Each command (`{"where": ..., "args": [...]}`, the arguments after `python -m ctl.run`) goes through
what `ctl.run` does before it trains, without training:

- its flags, parsed by the flags `ctl/run.py` defines (absl, enum values and required flags
  included), `--gin.NAME=VALUE` expanded by `ctl.config.gin_text` as the program does;
- its gin files and bindings, checked as text (`ctl.config.gin_text.check`), then parsed by
  `ctl.config.gin_config.parse` after `ctl.import_api()`: the files' `import` lines run, and every
  binding's configurable and parameter must be registered (`skip_unknown=False`). A gin file on a
  remote store (`gs://...`) is not read, and flags quoted in a sentence (`"fragment": true`) come
  without their gin files: then only the bindings' `ctl.` names and parameters are resolved.

One process checks a page's commands: a page's modules (written to its work dir) import once. With
`--serve` (what tests/test_docs.py starts, once per test process) that process is forked from a warm
one per page: the warm one imports TensorFlow and ctl's API, and no more (no op runs, no flag is
parsed, no gin file is read, as in `ctl.sweep.launcher`); the child changes to the page's work dir,
checks its commands and sends its problems back. A page's start then costs a fork, not TensorFlow's
import (~10 s a page on the loaded 2-core host, ~35 pages).
"""

import json
import os
import sys
from typing import Dict, List

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def check(command: Dict) -> List[str]:
    """The problems of one command (empty: `ctl.run` would accept it)."""
    from absl import flags
    import gin

    import ctl
    import ctl.run  # noqa: F401 - defines the flags of `python -m ctl.run` in absl's FLAGS.
    from ctl.config import gin_config as config, gin_text
    from ctl.utils.errors import UserError

    where, args = command["where"], command["args"]
    flag_values = flags.FLAGS
    flag_values.unparse_flags()
    try:
        rest = flag_values(["ctl.run"] + gin_text.expand_gin_flags(args))
    except (flags.Error, UserError) as error:
        return [f"{where}: `python -m ctl.run` refuses its flags: {error}"]
    if rest[1:]:
        return [f"{where}: `python -m ctl.run` takes no arguments but flags: {rest[1:]}"]
    local = [path for path in flag_values.gin_file if "://" not in path]
    remote = len(local) < len(flag_values.gin_file)
    bindings = list(flag_values.gin_bindings)
    search_paths = list(flag_values.gin_search_paths)
    ctl.import_api()
    gin.clear_config()
    try:
        gin_text.check(local, bindings, search_paths, ctl.__all__)
        if remote or command.get("fragment"):
            # The user's configurables are in a file not read here: ctl's names only.
            config.query_bindings_only(bindings, "ctl.Schedule.train_steps", None)
        else:
            config.parse(local, bindings, search_paths)
    except UserError as error:
        return [f"{where}: {error}"]
    finally:
        gin.clear_config()
    return []


def main() -> None:
    sys.path.insert(0, os.getcwd())  # The page's modules, as `python -m ctl.run` finds them.
    problems = []
    for command in json.load(sys.stdin):
        problems += check(command)
    print(json.dumps(problems))


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def serve() -> None:
    """Imports what `check` imports, then forks a child per request line on stdin; each reply line
    on stdout is the child's problems (JSON), or {"error": ...} when it failed."""
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # What the imports and the checks print goes to stderr, never into the replies.
    from absl import flags  # noqa: F401
    import gin  # noqa: F401

    import ctl
    import ctl.run  # noqa: F401 - the flags of `python -m ctl.run`, defined once here.
    from ctl.config import gin_config, gin_text  # noqa: F401
    from ctl.utils.errors import UserError  # noqa: F401

    ctl.import_api()
    warm_threads = threads()
    for line in sys.stdin:
        request = json.loads(line)
        if threads() > warm_threads:
            raise RuntimeError(f"{threads()} threads, more than the {warm_threads} after the imports: "
                               "forking is unsafe")
        read, write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # The child: the page's work dir, its modules first on the path, as main() has.
            os.close(read)
            try:
                os.chdir(request["workdir"])
                sys.path.insert(0, request["workdir"])
                problems = [problem for command in request["commands"] for problem in check(command)]
                reply = json.dumps(problems)
            except BaseException as error:  # noqa: BLE001 - reported, the child never returns.
                import traceback

                reply = json.dumps({"error": f"{error!r}\n{traceback.format_exc()}"})
            with os.fdopen(write, "w") as out:
                out.write(reply)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as answer:
            reply = answer.read()
        _, status = os.waitpid(pid, 0)
        if not reply:
            reply = json.dumps({"error": f"the child ended with status {os.waitstatus_to_exitcode(status)}"})
        replies.write(reply + "\n")


if __name__ == "__main__":
    serve() if sys.argv[1:] == ["--serve"] else main()
