"""Gin at the edges: parsing the user's config and saving what ran.

Flags name the files and bindings; everything the experiment does is read from
gin. `parse` turns every gin mistake into a one-line `UserError` (what the text
alone shows, `ctl.config.gin_text` finds first, before TensorFlow is imported).
"""

import ast
import contextlib
import difflib
import inspect
import os
import re
import tempfile
from typing import Any, Dict, List, Optional, Sequence

import gin
import tensorflow as tf

from ctl import compat
from ctl.utils.errors import UserError, first_line
from ctl.config.gin_text import check_gin_file
from ctl.model_dir.background import uploads
from ctl.model_dir import ModelDir, is_object_store, write_atomically
from ctl.model_dir.files import upload_written

# gin opens files with Python's `open`; this lets it read them through tf.io.gfile
# too, so a --gin_file or the trainer's config.gin may be in an object store.
gin.config.register_file_reader(tf.io.gfile.GFile, tf.io.gfile.exists)


def _suggest(message: str) -> str:
    """' Did you mean ...?' for gin's unknown-configurable and unknown-parameter errors."""
    unknown = re.match(r"No configurable matching (?:reference )?'@?([\w.]+)", message)
    if unknown:
        matches = difflib.get_close_matches(unknown.group(1), _registered_names(), n=3,
                                            cutoff=0.6)
        # A near name may be a typo, or only another function: the decorator hint either way.
        fix = ("needs @gin.configurable (or gin.external_configurable) in a module the gin file "
               "imports; ctl.KerasModelTask's model_fn, train_data and eval_data also take a "
               "'package.module.function' string.")
        if matches:
            return f" Did you mean {', '.join(matches)}? If not, a function of yours {fix}"
        return f" A function of yours {fix}"
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
    """Parses files (in order), then bindings; unknown names are errors.

    A file is checked before gin reads it (gin's own reader fails with a
    TypeError on some missing paths), and a macro bound in `gin_bindings` that
    no config refers to is an error: it would be silently ignored.

    Args:
        gin_files: the gin files (`--gin_file`), parsed in order.
        gin_bindings: the bindings (`--gin_bindings`), applied after the files.
        search_paths: where gin looks for files and their includes (`--gin_search_paths`).

    Raises:
        UserError: a missing file, an unknown name or parameter, a macro no config uses.
    """
    for path in search_paths:
        gin.add_config_file_search_path(path)
    for path in gin_files:
        check_gin_file(path, search_paths)
    with contextlib.ExitStack() as stack, _gin_errors():
        local = [_local_copy(path, stack) if "://" in path else path for path in gin_files]
        gin.parse_config_files_and_bindings(
            local, list(gin_bindings), skip_unknown=False, finalize_config=False
        )
        _check_command_line_macros(gin_bindings)
        gin.finalize()


def _local_copy(path: str, stack: contextlib.ExitStack) -> str:
    """A local copy of the gin file at `path` (e.g. `gs://.../config.gin`), deleted on exit.

    gin tries Python's `open` and its package-resource reader before the
    tf.io.gfile reader registered above, and the resource reader logs an ERROR
    for every path it cannot map to a package.
    """
    directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="ctl-gin-"))
    local = os.path.join(directory, os.path.basename(path))
    tf.io.gfile.copy(path, local)
    return local


def query_bindings_only(gin_bindings: Sequence[str], parameter: str, default: Any) -> Any:
    """The value `gin_bindings` alone give `parameter` (e.g. 'ctl.ContinuousEval.timeout'),
    or `default`; the bindings are forgotten again.

    For a setting needed before the config files can be read (the sidecar's
    wait for the trainer's config.gin): bindings of configurables not yet
    imported are skipped, but a binding of an unknown `ctl.` name, or of an
    unknown parameter of a `ctl.` configurable, is an error at once.

    Args:
        gin_bindings: the bindings (`--gin_bindings`).
        parameter: `Configurable.parameter`, e.g. 'ctl.ContinuousEval.timeout'.
        default: the value without a binding.
    """
    gin.clear_config()
    try:
        with _gin_errors():
            gin.parse_config_files_and_bindings(
                [], list(gin_bindings), skip_unknown=True, finalize_config=False)
        for binding in gin_bindings:
            selector = binding.split("=", 1)[0].strip()
            if selector.startswith("ctl.") and "." in selector[4:]:
                name = selector.rsplit(".", 1)[0]
                try:
                    gin.get_configurable(name)
                except ValueError:
                    raise UserError(
                        f"bad gin config: No configurable matching '{name}' (in --gin_bindings "
                        f"{binding!r}).{_suggest(f'No configurable matching {name!r}')} Fix "
                        "the binding in --gin_bindings.") from None
        try:
            return gin.query_parameter(parameter)
        except ValueError:  # Not bound.
            return default
    finally:
        gin.clear_config()


def _check_command_line_macros(gin_bindings: Sequence[str]) -> None:
    """Raises `UserError` for a macro bound on the command line that no config refers to."""
    referenced = set(re.findall(r"%([A-Za-z_][\w./]*)", gin.config_str()))
    for binding in gin_bindings:
        match = re.match(r"\s*([A-Za-z_]\w*)\s*=", binding)
        if match and match.group(1) not in referenced:
            name = match.group(1)
            matches = difflib.get_close_matches(name, sorted(referenced), n=3, cutoff=0.6)
            hint = (f"did you mean {', '.join(matches)}?" if matches else
                    f"the macros in use: {', '.join(sorted(referenced)) or 'none'}.")
            raise UserError(f"--gin_bindings binds the macro {name}, which no config refers "
                            f"to (as %{name}); {hint}")


@contextlib.contextmanager
def _gin_errors():
    """Turns gin's exceptions for a bad config into one-line `UserError`s."""
    try:
        yield
    except (IOError, OSError) as error:
        raise UserError(
            f"cannot read gin file: {first_line(error, limit=None)}; check --gin_file, the `include` "
            "lines of the files and --gin_search_paths."
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
    """Calls a gin configurable, turning a missing REQUIRED binding into a UserError.

    Args:
        fn: the configurable (e.g. `ctl.Experiment`), called without arguments.
    """
    try:
        return fn()
    except RuntimeError as error:
        if "Required bindings" not in str(error):
            raise
        raise UserError(
            f"{first_line(error, None)}; set it in a --gin_file or with --gin_bindings."
        ) from error


def save_config(directory: ModelDir) -> None:
    """Saves the parsed config (files and bindings) as `<model_dir>/config.gin`.

    Args:
        directory: the run's model dir.
    """
    write_atomically(directory.config_file, gin.config_str())


def save_operative_config(directory: ModelDir) -> None:
    """Saves the values actually used, as a file and a text summary of the train run (in an
    object store on the uploads' thread: a dozen requests there, after the first train loop).

    Args:
        directory: the run's model dir.
    """
    text = gin.operative_config_str()
    if is_object_store(directory.path):
        uploads().submit(_write_operative_config, directory, text)
    else:
        _write_operative_config(directory, text)


def _write_operative_config(directory: ModelDir, text: str) -> None:
    write_atomically(directory.operative_config_file, text)

    def write(summary_dir: str) -> None:
        writer = tf.summary.create_file_writer(summary_dir)
        with writer.as_default():
            tf.summary.text("operative_config", gin.markdown(text), step=0)
        writer.close()

    upload_written(directory.train_dir, write)  # In an object store: locally, then uploaded.


def operative_values(text: Optional[str] = None) -> Dict[str, Any]:
    """The operative config (`gin.operative_config_str()`, or `text` of an
    operative_config.gin) as `{"Configurable.parameter": value}`, macros by name.

    Numbers, booleans and strings are Python values; references (`@fn()`),
    macros (`%NAME`), None and containers stay their gin text, e.g.
    `{"Schedule.train_steps": "%TRAIN_STEPS", "TRAIN_STEPS": 2000}`.

    Args:
        text: an operative_config.gin's text (None: this process's operative config).
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
