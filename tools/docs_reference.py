"""The docs site's reference pages, generated from the code at build time (a MkDocs hook).

`mkdocs.yml` names this file under `hooks:`; on every build it adds:

- `reference/cli.md`: every flag of `python -m ctl.run`, `ctl.report` and `ctl.launch`,
  read from the programs themselves (`--helpxml` for absl flags, `--help` for argparse);
- `reference/gin.md`: every gin configurable ctl registers, with each parameter's
  default, read with `inspect.signature` after `ctl.import_api()`;
- `reference/api.md`: a mkdocstrings block per public name of `ctl` (`ctl.__all__`);

fills `<!-- generated: exit-statuses -->` in `reference/exit-statuses.md` with the
`EXIT_*` constants found in ctl's modules, and `<!-- generated: BUILD.md "## Heading" -->` with
that section of BUILD.md (the architecture has one source, for the site and for developers; a line of its code
blocks too long for the page's column is wrapped: `fit_code_lines`). Nothing here is written by hand, so
the pages follow the code: a new flag, configurable or public name appears on
the next build. The functions return Markdown and are called by
`tests/test_docs.py` too.
"""

import dataclasses
import html
import importlib
import inspect
import os
import pkgutil
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from typing import Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLIS = ("ctl.run", "ctl.train", "ctl.report", "ctl.launch", "ctl.sweep")
EXIT_MARKER = "<!-- generated: exit-statuses -->"
SECTION_MARKER = re.compile(r'<!-- generated: ([\w.]+) "(#+ [^"]+)" -->')


def _cell(text: str) -> str:
    """Plain `text` made safe for one cell of a Markdown table (`<model_dir>` stays text, not a tag)."""
    return html.escape(" ".join(str(text).split()), quote=False).replace("|", "\\|")


def _code(text: str) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return f"`{text}`" if text else ""


def _run_help(module: str, flag: str) -> str:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-m", module, flag], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)
    return done.stdout


def cli_flags(module: str) -> Tuple[str, List[Dict[str, str]], str]:
    """(usage, flags, help text) of one CLI.

    An absl program answers `--helpxml`: its own flags (those defined in ctl's
    files) come back as dicts. An argparse program answers `--help`: its text.
    """
    xml = _run_help(module, "--helpxml")
    if xml.lstrip().startswith("<?xml"):
        tree = ElementTree.fromstring(xml)
        found = []
        for flag in tree.iter("flag"):
            path = flag.findtext("file", "")
            if os.sep + "ctl" + os.sep not in path and not path.startswith("ctl"):
                continue
            found.append({
                "name": flag.findtext("name", ""),
                "type": flag.findtext("type", ""),
                "default": flag.findtext("default", ""),
                # absl starts an enum's meaning with "<a|b|c>: "; the values get a sentence of their own.
                "meaning": re.sub(r"^<[^>]*>: ", "", flag.findtext("meaning", "").split(";\n")[0]),
                "values": ", ".join(v.text for v in flag.iter("enum_value")),
            })
        return tree.findtext("usage", ""), sorted(found, key=lambda f: f["name"]), ""
    return "", [], _run_help(module, "--help")


def flag_spec(module: str) -> Dict[str, set]:
    """Every flag `python -m module` accepts (absl's own included), mapped to its allowed values (empty: any)."""
    xml = _run_help(module, "--helpxml")
    if xml.lstrip().startswith("<?xml"):
        tree = ElementTree.fromstring(xml)
        spec = {}
        for flag in tree.iter("flag"):
            values = {v.text for v in flag.iter("enum_value")}
            spec[flag.findtext("name", "")] = values
            if flag.findtext("type", "") == "bool":
                spec["no" + flag.findtext("name", "")] = set()
        return spec
    text = _run_help(module, "--help")
    return {name: set() for name in re.findall(r"--(\w+)", text)}


def cli_page() -> str:
    lines = ["# Command-line flags", "",
             "Generated from the programs at build time (`--helpxml`, `--help`): this page lists "
             "exactly the flags the code defines. A misspelt flag ends in one line on stderr and "
             "exit status 2 ([Exit statuses](exit-statuses.md)).", ""]
    for module in CLIS:
        usage, flags, text = cli_flags(module)
        lines += [f"## `python -m {module}`", ""]
        if flags:
            summary = usage.strip().split("\n\n")[0].strip()
            lines += [html.unescape(summary), "",
                      "| flag | type | default | meaning |", "|---|---|---|---|"]
            for flag in flags:
                meaning = flag["meaning"] + (f" One of: {flag['values']}." if flag["values"] else "")
                lines.append(f"| `--{flag['name']}` | {_cell(flag['type'])} | "
                             f"{_code(flag['default'])} | {_cell(meaning)} |")
            lines += ["", "absl's own flags (`--verbosity`, `--helpfull`, `--flagfile`, ...) work "
                      "too; `--helpfull` lists them.", ""]
        else:
            lines += ["```text", text.rstrip(), "```", ""]
    return "\n".join(lines) + "\n"


def gin_configurables() -> List[Tuple[str, object, tuple]]:
    """(gin name, the callable, parameters gin may not bind) of every configurable ctl registers."""
    import gin
    import ctl
    from ctl import compat

    ctl.import_api()
    found = []
    for name in compat.registered_configurables():
        if name.startswith("gin."):
            continue  # gin's own: gin.macro, gin.constant, gin.singleton.
        configurable = gin.config.parse_value(f"@{name}").configurable
        found.append((name, configurable.wrapped, tuple(configurable.denylist or ())))
    return found


def _first_paragraph(obj) -> str:
    doc = inspect.getdoc(obj) or ""
    return doc.split("\n\n")[0]


def _default_factories(wrapped) -> Dict[str, object]:
    """A dataclass's `default_factory` per field (inspect shows those defaults as `<factory>`)."""
    if not dataclasses.is_dataclass(wrapped):
        return {}
    return {f.name: f.default_factory for f in dataclasses.fields(wrapped)
            if f.default_factory is not dataclasses.MISSING}


def _default(parameter, factory) -> str:
    """How the reference shows a parameter's default."""
    if factory is not None:
        return f"a new `{getattr(factory, '__qualname__', factory)}()`"
    import gin

    if parameter.default is parameter.empty or parameter.default is gin.REQUIRED:
        return "*required*"
    if inspect.isclass(parameter.default) or inspect.isfunction(parameter.default):
        return f"`{parameter.default.__module__}.{parameter.default.__qualname__}`"
    return _code(repr(parameter.default))


def gin_page() -> str:
    lines = ["# Gin configurables", "",
             "Generated from the code at build time: every name ctl registers with gin "
             "(`ctl.import_api()` registers them all), with each parameter and its default. "
             "*required* means no default: bind it, or gin stops with the name of the missing "
             "binding. A parameter gin may not bind (the Trainer's task and strategy) is left out.",
             ""]
    for name, wrapped, denied in gin_configurables():
        lines += [f"## `{name}`", "", _first_paragraph(wrapped), ""]
        if not name.startswith("ctl."):
            lines += [f"Registered by ctl from `{wrapped.__module__}`; its parameters are the "
                      "library's own.", ""]
        try:
            parameters = inspect.signature(wrapped).parameters.values()
        except (TypeError, ValueError):
            parameters = []
        rows = [p for p in parameters if p.name not in denied and p.name != "self"
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if rows:
            lines += ["| parameter | default |", "|---|---|"]
            factories = _default_factories(wrapped)
            for p in rows:
                lines.append(f"| `{name}.{p.name}` | {_default(p, factories.get(p.name))} |")
            lines.append("")
    return "\n".join(lines) + "\n"


API_OVERVIEW = """\
## Overview

A run is a task, a trainer, an experiment that names them, and one call that runs it; hooks add to it.

| Name | What it is | What you do with it |
|---|---|---|
| [`ctl.Task`](#ctl.Task) | *what* to train: the model, optimizer, inputs, losses and metrics, and the steps \
(`train_step`, `validation_step`: per replica, inside `tf.function`) | subclass it, `@gin.configurable` |
| [`ctl.Trainer`](#ctl.Trainer) | *how* to train: the loops, distribution, checkpoints, and the train step's \
settings (mixed precision, XLA, clipping, accumulation, a moving average) | set it in gin \
(`ctl.Trainer.jit_compile = True`); subclass it only to change the loop |
| [`ctl.Experiment`](#ctl.Experiment) | one run: the task, the trainer class, the \
[`ctl.Schedule`](#ctl.Schedule) (steps, intervals) and the hooks | set it in gin \
(`ctl.Experiment.task = @MyTask()`) |
| [`ctl.run_experiment`](#ctl.run_experiment) | runs the experiment gin configured, in a mode \
(`train`, `eval`, `train_and_eval`, `continuous_eval`, `smoke`) and a model dir | `python -m ctl.run` \
calls it; call it to run ctl from a program of yours |
| [`ctl.hooks`](#ctlhooks) | what a run does at its events: keep the best checkpoint, export SavedModels, \
stop early, warm-start, profile, call Keras callbacks, or a `Hook` of yours | list them in \
`ctl.Experiment.hooks` |

The rest, by use:

- a compiled Keras model or a Model Garden experiment as a task: [`ctl.KerasModelTask`](#ctl.KerasModelTask), \
[`ctl.ModelGardenTask`](#ctl.ModelGardenTask);
- settings, in gin: [`ctl.Schedule`](#ctl.Schedule), [`ctl.FaultTolerance`](#ctl.FaultTolerance) \
(preemption, NaN, resume), [`ctl.ContinuousEval`](#ctl.ContinuousEval) (the sidecar evaluator);
- a task's own arguments checked: [`ctl.check_arguments`](#ctl.check_arguments), [`ctl.Range`](#ctl.Range), \
[`ctl.Check`](#ctl.Check);
- learning rates: [`ctl.with_warmup`](#ctl.with_warmup), [`ctl.register_schedules`](#ctl.register_schedules);
- metrics over a whole eval set: [`ctl.Reducer`](#ctl.Reducer), [`ctl.Aggregation`](#ctl.Aggregation);
- the trained model back in Python: [`ctl.restore_model`](#ctl.restore_model);
- errors and the loop's ends: [`ctl.UserError`](#ctl.UserError), [`ctl.TrainLoopEnd`](#ctl.TrainLoopEnd); \
the modes: [`ctl.MODES`](#ctl.MODES).\
"""


def api_page() -> str:
    import ctl

    lines = ["# Python API", "", API_OVERVIEW, "",
             "## Every name, A to Z", "",
             "Generated from the docstrings: every public name of `ctl` (`ctl.__all__`), then "
             "`ctl.hooks`. `import ctl` is cheap; the first use of a name imports the whole API.", ""]
    modules = []
    for name in ctl.__all__:
        obj = getattr(ctl, name)
        if inspect.ismodule(obj):
            modules.append((name, obj))
            continue
        # Documented under its public name (`ctl.Task`, not the module that defines it): mkdocstrings
        # follows ctl/__init__.py's re-exports, so the page's anchors are `ctl.NAME` too.
        # mkdocstrings' own heading (`ctl.NAME`, then the signature), at the page's second level.
        lines += [f"::: ctl.{name}", "    options:",
                  "      heading_level: 2", "      show_root_heading: true",
                  "      show_root_full_path: false", f"      heading: ctl.{name}",
                  f"      toc_label: ctl.{name}"]
        inherited = _inherited_from_ctl(obj) if inspect.isclass(obj) else []
        if inherited:  # e.g. the Trainer's `evaluate`, from ctl.core.evaluation.Evaluation.
            lines += ["      inherited_members:"] + [f"        - {m}" for m in inherited]
        lines.append("")
    for name, module in modules:
        members = [m for m in getattr(module, "__all__", []) if not m.startswith("_")]
        lines += [f"## `ctl.{name}`", "", f"::: {module.__name__}", "    options:",
                  "      heading_level: 3", "      show_root_heading: false",
                  "      show_root_toc_entry: false"]
        if members:
            lines += ["      members:"] + [f"        - {m}" for m in members]
        lines.append("")
    return "\n".join(lines) + "\n"


def _inherited_from_ctl(cls) -> List[str]:
    """The public methods `cls` inherits from ctl's own base classes that have no entry of their own
    on the page (the Trainer's from `Evaluation`; not a KerasModelTask's from `ctl.Task`, nor
    TensorFlow's or orbit's)."""
    import ctl

    public = [getattr(ctl, name) for name in ctl.__all__]
    own = set(vars(cls))
    return sorted({name for base in cls.__mro__[1:]
                   if base.__module__.startswith("ctl.") and not any(base is p for p in public)
                   for name, value in vars(base).items()
                   if not name.startswith("_") and name not in own and callable(value)
                   and inspect.getdoc(value)})


def exit_constants() -> List[Tuple[int, str, str]]:
    """(value, name, module) of every module-level `EXIT_*` integer in ctl."""
    import ctl

    found = set()
    for info in pkgutil.walk_packages(ctl.__path__, "ctl."):
        try:
            module = importlib.import_module(info.name)
        except Exception:  # noqa: BLE001 - a module that cannot import here has no constant to list.
            continue
        for attr, value in vars(module).items():
            if attr.startswith("EXIT_") and isinstance(value, int) and not isinstance(value, bool):
                if _defining_module(module, attr):  # Not a module that imported it.
                    found.add((value, attr, info.name))
    return sorted(found)


def _defining_module(module, attr: str) -> str:
    """The module whose source assigns `attr` (not one that imported it)."""
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return ""
    return module.__name__ if f"\n{attr} =" in "\n" + source else ""


def exit_table() -> str:
    lines = ["| status | constant | defined in |", "|---|---|---|"]
    lines += [f"| {value} | `{name}` | `{module}` |" for value, name, module in exit_constants()]
    return "\n".join(lines)


def section(path: str, heading: str) -> str:
    """The section of the file at `path` (relative to the repository) that starts with the line `heading`,
    up to the next heading of its level or above, without the heading itself."""
    with open(os.path.join(ROOT, path)) as f:
        lines = f.read().splitlines()
    level = len(heading) - len(heading.lstrip("#"))
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    except StopIteration:
        raise ValueError(f"{path} has no line starting with {heading!r}") from None
    end, fenced = len(lines), False
    for i in range(start + 1, len(lines)):
        fenced ^= lines[i].lstrip().startswith("```")
        if not fenced and lines[i].startswith("#") and len(lines[i]) - len(lines[i].lstrip("#")) <= level:
            end = i
            break
    return "\n".join(lines[start + 1:end]).strip()


CODE_COLUMNS = 84  # What a code block shows at 1280 px without scrolling sideways (tests/test_docs.py).
_DESCRIPTION = re.compile(r"\S {2,}(?=\S)")  # A tree's name, then its description after two spaces or more.


def fit_code_lines(markdown: str, columns: int = CODE_COLUMNS) -> str:
    """`markdown` with each line of its fenced code blocks longer than `columns` wrapped at a space, the rest
    indented as the line's description (the text after its first run of two spaces or more, as a layout
    tree's) or four spaces further than the line.

    Args:
        markdown: Markdown text.
        columns: the longest line a code block keeps.
    """
    out, fenced = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        while fenced and len(line) > columns and " " in line.strip():
            description = _DESCRIPTION.search(line)
            indent = description.end() if description else len(line) - len(line.lstrip()) + 4
            cut = line.rfind(" ", indent + 1, columns + 1)
            if len(line) - cut <= 3:  # Not a lone `--` or `,` on a line of its own.
                cut = line.rfind(" ", indent + 1, cut)
            if cut <= indent:
                break  # One word longer than the column: left as it is.
            out.append(line[:cut].rstrip())
            line = " " * indent + line[cut + 1:].lstrip()
        out.append(line)
    return "\n".join(out)


def version() -> str:
    """ctl's version, as `pyproject.toml` declares it."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["version"]


def on_config(config):
    """MkDocs hook: the version in every page's footer (the changelog says what it holds)."""
    config["copyright"] = f"ctl {version()}"
    return config


def on_files(files, config):
    """MkDocs hook: adds the generated pages to the site."""
    from mkdocs.structure.files import File

    for uri, make in (("reference/cli.md", cli_page), ("reference/gin.md", gin_page),
                      ("reference/api.md", api_page)):
        files.append(File.generated(config, uri, content=make()))
    return files


_LIST_ITEM = re.compile(r"^(\s*)([-*]|1\.) \S")
_FENCE = re.compile(r"^\s*(```|~~~)")


def lists_after_paragraphs(markdown: str) -> str:
    """`markdown` with a blank line before each list that starts right under a paragraph's line.

    GitHub's Markdown lets a list interrupt a paragraph ("Why:" then "- a" on the next line), so
    README.md and BUILD.md read right there; Python-Markdown (this site) needs the blank line, else
    the list is one paragraph with literal "- ". Lines in code fences are left alone.
    """
    lines, fenced, out = markdown.split("\n"), False, []
    for i, line in enumerate(lines):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and i and _LIST_ITEM.match(line):
            before = lines[i - 1]
            indent = len(line) - len(line.lstrip())
            if (before.strip() and not _LIST_ITEM.match(before) and not before.lstrip().startswith(("|", "<", "#"))
                    and len(before) - len(before.lstrip()) == indent):
                out.append("")
        out.append(line)
    return "\n".join(out)


DOCS_MENTION = re.compile(r"\bdocs/([\w./-]+\.md)\b")
# What is not running text: code blocks, links (already) and the tags themselves.
_NOT_TEXT = re.compile(r"(<pre\b.*?</pre>|<a\b.*?</a>|<[^>]+>)", re.S)


def on_page_content(html, page, config, files):
    """MkDocs hook: a mention of `docs/NAME.md` (in a page or a docstring of the API page) links to
    that page of the site."""
    def link(match):
        target = files.get_file_from_path(match.group(1))
        if target is None:
            return match.group(0)  # Not a page (tests/test_docs.py checks cited paths exist).
        return f'<a href="{target.url_relative_to(page.file)}">{match.group(0)}</a>'

    parts = _NOT_TEXT.split(html)
    return "".join(part if i % 2 else DOCS_MENTION.sub(link, part) for i, part in enumerate(parts))


def on_page_markdown(markdown, page, config, files):
    """MkDocs hook: fills the generated parts of hand-written pages; lists read as on GitHub."""
    if EXIT_MARKER in markdown:
        markdown = markdown.replace(EXIT_MARKER, exit_table())
    markdown = SECTION_MARKER.sub(lambda m: fit_code_lines(section(m.group(1), m.group(2))), markdown)
    return lists_after_paragraphs(markdown)
