"""Gin at the edges: parsing the user's config and saving what ran.

Flags name the files and bindings; everything the experiment does is read from
gin. `parse` turns every gin mistake into a one-line `UserError`.
"""

import ast
import difflib
import inspect
import json
import os
import re
from typing import Any, Dict, List, Optional, Sequence

import gin
import tensorflow as tf

from ctl import compat
from ctl.core.errors import UserError

CONFIG_FILE = "config.gin"
OPERATIVE_CONFIG_FILE = "operative_config.gin"
GIN_FLAG_PREFIX = "--gin."


def expand_gin_flags(argv: Sequence[str]) -> List[str]:
    """Turns each `--gin.NAME=VALUE` into `--gin_bindings=NAME=VALUE` (before absl parses)."""
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


def _suggest(message: str) -> str:
    """' Did you mean ...?' for gin's unknown-configurable and unknown-parameter errors."""
    unknown = re.match(r"No configurable matching (?:reference )?'@?([\w.]+)", message)
    if unknown:
        matches = difflib.get_close_matches(unknown.group(1), _registered_names(), n=3,
                                            cutoff=0.6)
        return f" Did you mean {', '.join(matches)}?" if matches else ""
    parameter = re.match(r"Configurable '([\w.]+)' doesn't have a parameter named '(\w+)'",
                         message)
    if parameter:
        try:
            target = gin.get_configurable(parameter.group(1))
            names = list(inspect.signature(target).parameters)
        except (ValueError, TypeError):
            return ""
        matches = difflib.get_close_matches(parameter.group(2), names, n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(matches)}? " if matches else ""
        return f" ({hint}its parameters: {', '.join(names)})"
    return ""


def _registered_names() -> List[str]:
    """Every registered configurable, by full and short name."""
    names = set()
    for selector in compat.registered_configurables():
        names.add(selector)
        names.add(selector.rsplit(".", 1)[-1])
    return sorted(names)


def parse(
    gin_files: Sequence[str], gin_bindings: Sequence[str], search_paths: Sequence[str] = ()
) -> None:
    """Parses files (in order), then bindings; unknown names are errors."""
    for path in search_paths:
        gin.add_config_file_search_path(path)
    try:
        gin.parse_config_files_and_bindings(
            list(gin_files), list(gin_bindings), skip_unknown=False, finalize_config=True
        )
    except (IOError, OSError) as error:
        raise UserError(
            f"cannot read gin file: {error}; check --gin_file and --gin_search_paths."
        ) from error
    except ImportError as error:
        raise UserError(
            f"a gin file imports a module that cannot be imported: {error}; check the "
            "`import` lines of --gin_file and that the package is installed."
        ) from error
    except SyntaxError as error:
        raise UserError(f"cannot parse gin config: {error}") from error
    except ValueError as error:
        lines = [line.strip() for line in str(error).splitlines()]
        where = f" ({lines[1]})" if len(lines) > 1 and lines[1].startswith("In ") else ""
        raise UserError(
            f"bad gin config: {lines[0]}{where}{_suggest(lines[0])} Fix the binding in "
            "--gin_file or --gin_bindings."
        ) from error


def call_configured(fn):
    """Calls a gin configurable, turning a missing REQUIRED binding into a UserError."""
    try:
        return fn()
    except RuntimeError as error:
        if "Required bindings" not in str(error):
            raise
        raise UserError(
            f"{str(error).splitlines()[0]}; set it in a --gin_file or with --gin_bindings."
        ) from error


def write_atomically(path: str, text: str) -> None:
    """Writes `text` to `path` so that readers see the old or the new file, never half."""
    temp = f"{path}.tmp-{os.getpid()}"
    with tf.io.gfile.GFile(temp, "w") as f:
        f.write(text)
    tf.io.gfile.rename(temp, path, overwrite=True)


def read_json(path: str, default: Any = None) -> Any:
    """The JSON value stored at `path`, or `default` when there is no such file."""
    if not tf.io.gfile.exists(path):
        return default
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


def write_json(path: str, value: Any) -> None:
    """Stores `value` at `path` atomically (creating the directory)."""
    tf.io.gfile.makedirs(os.path.dirname(path))
    write_atomically(path, json.dumps(value))


def save_config(model_dir: str) -> None:
    """Saves the parsed config (files and bindings) as `<model_dir>/config.gin`."""
    write_atomically(os.path.join(model_dir, CONFIG_FILE), gin.config_str())


def save_operative_config(model_dir: str, summary_dir: str) -> None:
    """Saves the values actually used, as a file and a TensorBoard text summary."""
    text = gin.operative_config_str()
    write_atomically(os.path.join(model_dir, OPERATIVE_CONFIG_FILE), text)
    writer = tf.summary.create_file_writer(summary_dir)
    with writer.as_default():
        tf.summary.text("operative_config", gin.markdown(text), step=0)
    writer.close()


def operative_values(text: Optional[str] = None) -> Dict[str, Any]:
    """The operative config (`gin.operative_config_str()`, or `text` of an
    operative_config.gin) as `{"Configurable.parameter": value}`, macros by name.

    Numbers, booleans and strings are Python values; references (`@fn()`),
    macros (`%NAME`), None and containers stay their gin text, e.g.
    `{"Schedule.train_steps": "%TRAIN_STEPS", "TRAIN_STEPS": 2000}`.
    """
    text = gin.operative_config_str() if text is None else text
    bindings: List[List[str]] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[0].isspace() and bindings:  # A value continued on the next line.
            bindings[-1][1] += " " + line.strip()
            continue
        name, equals, value = line.partition(" = ")
        if equals and not line.startswith(("import ", "from ", "include ")):
            bindings.append([name.strip(), value.strip()])
    values = {}
    for name, value in bindings:
        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            parsed = value
        values[name] = parsed if isinstance(parsed, (bool, int, float, str)) else value
    return values
