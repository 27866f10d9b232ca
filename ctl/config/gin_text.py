"""A gin config as text: the `--gin.` flags, the files and their syntax, checked before any import.

`python -m ctl.run` answers `--help`, a flag mistake and a gin mistake it can
see in the text in a fraction of a second: this module imports neither
TensorFlow nor the modules a gin file names. `check` finds a missing or
unreadable file (also one named by an `include`), a syntax error, and a
`ctl.NAME` that is not one of ctl's public names; `ctl.config.gin_config.parse`
then parses the config for real (imports, parameters, values).

Gin files are the user's (not the model dir's): a local path is read with
Python's own file functions, a `gs://`-style one through `tf.io.gfile`
(imported only then).
"""

import difflib
import os
import re
import tokenize
from typing import List, Optional, Sequence

from gin import config_parser

from ctl.utils.errors import UserError, first_line

GIN_FLAG_PREFIX = "--gin."
_INCLUDE = re.compile(r"\s*include\s+(['\"])(.+)\1\s*(#.*)?$")


def expand_gin_flags(argv: Sequence[str]) -> List[str]:
    """Turns each `--gin.NAME=VALUE` into `--gin_bindings=NAME=VALUE` (before absl parses).

    Args:
        argv: the command line.
    """
    expanded = []
    for arg in argv:
        if arg.startswith(GIN_FLAG_PREFIX):
            name, equals, value = arg[len(GIN_FLAG_PREFIX):].partition("=")
            if not name or not equals:
                raise UserError(f"Received {arg!r}; write --gin.NAME=VALUE, e.g. "
                                "--gin.ctl.Schedule.train_steps=500.")
            arg = f"--gin_bindings={name}={value}"
        expanded.append(arg)
    return expanded


def check(gin_files: Sequence[str], gin_bindings: Sequence[str], search_paths: Sequence[str],
          public_names: Sequence[str]) -> None:
    """Raises `UserError` for a gin file that cannot be read, a syntax error in a
    file or a binding, or a `ctl.NAME` that is not in `public_names` (ctl's API).

    Args:
        gin_files: the gin files.
        gin_bindings: the bindings.
        search_paths: where gin looks for files.
        public_names: ctl's public names (`ctl.__all__`).
    """
    for path in gin_files:
        for found, text in _files(path, search_paths):
            _check_syntax(text, found, "--gin_file or its `include`s", public_names)
    for binding in gin_bindings:
        _check_syntax(binding, f"--gin_bindings={binding!r}", "--gin_bindings", public_names)


def check_gin_file(path: str, search_paths: Sequence[str], what: Optional[str] = None,
                   seen: Sequence[str] = ()) -> None:
    """Raises `UserError` unless `path`, and every file it `include`s, is a readable file.

    Looked up as gin does: as given, then under each search path. Checked
    before gin parses anything, because gin's package-resource reader fails
    with a TypeError on some missing paths.

    Args:
        path: the file, as given.
        search_paths: where gin looks for it.
        what: how the message names it (default: the gin file).
        seen: the files that include it (an include cycle is an error).
    """
    for _ in _files(path, search_paths, what, seen):
        pass


def _files(path: str, search_paths: Sequence[str], what: Optional[str] = None,
           seen: Sequence[str] = ()):
    """Yields (path found, text) for `path` and, depth first, every file it `include`s."""
    what = what or f"--gin_file={path}"
    candidates = [path] + [os.path.join(d, path) for d in search_paths if not os.path.isabs(path)]
    found = next((c for c in candidates if _exists(c)), None)
    if found is None:
        where = f" (searched: {', '.join(search_paths)})" if search_paths else ""
        raise UserError(f"cannot read gin file: {what} does not exist{where}; check "
                        "--gin_file, the `include` lines of the files and --gin_search_paths.")
    if _isdir(found):
        raise UserError(f"{what} is a directory; name a .gin file in it.")
    if found in seen:
        raise UserError(f"gin file {found} includes itself ({' -> '.join([*seen, found])}); "
                        "remove the `include` line that closes the circle.")
    try:
        text = _read(found).decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"cannot read gin file {found} ({first_line(error)}); pass a "
                        "UTF-8 text file.") from error
    yield found, text
    for number, line in enumerate(text.splitlines(), 1):
        match = _INCLUDE.match(line)
        if match:
            yield from _files(match.group(2), search_paths,
                              f"{match.group(2)} (`include` at {found}:{number})", [*seen, found])


def _check_syntax(text: str, where: str, fix_in: str, public_names: Sequence[str]) -> None:
    try:
        for statement in config_parser.ConfigParser(text, _Placeholders(public_names, fix_in)):
            selector = getattr(statement, "selector", None)
            if isinstance(statement, config_parser.BindingStatement) and selector:
                _check_ctl_name(selector, public_names, fix_in)
    except SyntaxError as error:
        raise UserError(f"cannot parse gin config: {error.msg} ({where}, line {error.lineno}); "
                        f"fix it in {fix_in}.") from None
    except tokenize.TokenError as error:  # e.g. a bracket left open.
        raise UserError(f"cannot parse gin config: {error.args[0]} ({where}); fix it in "
                        f"{fix_in}.") from None


def _check_ctl_name(selector: str, public_names: Sequence[str], fix_in: str) -> None:
    """A two-part `ctl.NAME` must name one of ctl's public names (longer ones may be a
    user's module)."""
    parts = selector.split("/")[-1].split(".")
    if len(parts) == 2 and parts[0] == "ctl" and parts[1] not in public_names:
        matches = difflib.get_close_matches(parts[1], public_names, n=3, cutoff=0.6)
        hint = f" Did you mean {', '.join('ctl.' + m for m in matches)}?" if matches else ""
        raise UserError(f"bad gin config: No configurable matching 'ctl.{parts[1]}'.{hint} "
                        f"Fix the binding in {fix_in}.")


class _Placeholders(config_parser.ParserDelegate):
    """Stands in for configurable references and macros: syntax only, nothing imported."""

    def __init__(self, public_names: Sequence[str], fix_in: str):
        self._public_names = public_names
        self._fix_in = fix_in

    def configurable_reference(self, scoped_configurable_name, evaluate):
        _check_ctl_name(scoped_configurable_name, self._public_names, self._fix_in)
        return None

    def macro(self, macro_name):
        return None


def _exists(path: str) -> bool:
    return _gfile().exists(path) if "://" in path else os.path.exists(path)


def _isdir(path: str) -> bool:
    return _gfile().isdir(path) if "://" in path else os.path.isdir(path)


def _read(path: str) -> bytes:
    if "://" in path:
        gfile = _gfile()
        try:
            with gfile.GFile(path, "rb") as f:
                return f.read()
        except Exception as error:  # tf.errors.OpError, without importing TF first.
            raise OSError(str(error)) from error
    with open(path, "rb") as f:
        return f.read()


def _gfile():
    import tensorflow as tf  # Only for a remote gin file.

    return tf.io.gfile
