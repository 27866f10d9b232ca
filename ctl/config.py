"""Gin at the edges: parsing the user's config and saving what ran.

Flags name the files and bindings; everything the experiment does is read from
gin. `parse` turns every gin mistake into a one-line `UserError`.
"""

import os
from typing import Sequence

import gin
import tensorflow as tf

from ctl.errors import UserError

CONFIG_FILE = "config.gin"
OPERATIVE_CONFIG_FILE = "operative_config.gin"


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
        raise UserError(
            f"bad gin config: {error}; fix the binding in --gin_file or --gin_bindings."
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
