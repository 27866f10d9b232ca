"""The architecture as checked facts: one direction of dependency, BUILD.md's layout, and a
`ctl` package that imports TensorFlow only when a public name is used.

The import-linter contracts live in pyproject.toml (`[tool.importlinter]`):
entry points above the composition root, above the subsystems (sidecar,
hooks, faults, cluster: independent of each other), above core, above config, above
model_dir, above utils; inside core, the
controller over the Trainer over its evaluation over its loop functions over the runner
contract; no cycles.
"""

import ast
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.support.env import ROOT, ctl_env

LINT_IMPORTS = ("import sys; from importlinter.cli import lint_imports_command; "
                "sys.exit(lint_imports_command())")


def lint_imports(root: str) -> subprocess.CompletedProcess:
    """`lint-imports` on the `ctl` package under `root`, with `root`'s pyproject.toml."""
    return subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache"], cwd=root, capture_output=True,
        text=True, timeout=300, env=ctl_env({"PYTHONPATH": root}),
    )


def test_import_contracts_hold():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_back_edge_into_a_subsystem_breaks_the_contracts(tmp_path):
    """core naming a subsystem (here the fault tolerance's NaN policy) is refused."""
    shutil.copytree(os.path.join(ROOT, "ctl"), tmp_path / "ctl",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), tmp_path / "pyproject.toml")
    trainer = tmp_path / "ctl" / "core" / "trainer.py"
    trainer.write_text(trainer.read_text().replace(
        "\nimport gin\n", "\nimport gin\nfrom ctl.faults import nan_guard  # noqa\n", 1))
    result = lint_imports(str(tmp_path))
    assert result.returncode != 0
    assert "ctl.core is not allowed to import ctl.faults" in result.stdout
    assert "ctl.core.trainer -> ctl.faults.nan_guard" in result.stdout


def _layout():
    """What BUILD.md's layout tree names under ctl/: its folders, and its files as paths relative to ctl/."""
    with open(os.path.join(ROOT, "BUILD.md")) as f:
        text = f.read()
    tree = text.split("```", 2)[1]  # The first code block is the layout tree.
    folders, modules, package = set(), set(), None
    for line in tree.splitlines():
        match = re.match(r"^  (\s*)(\S+)", line)
        if not match:
            package = None if line.strip() and not line.startswith(" ") else package
            continue
        indent, name = len(match.group(1)), match.group(2)
        if name.endswith("/") and indent == 0:
            package = name.rstrip("/")
            folders.add(package)
        elif name.endswith(".py"):
            modules.add(f"{package}/{name}" if indent > 0 and package else name)
    return folders, modules


def test_build_md_layout_names_every_package_of_ctl_and_no_file_that_is_gone():
    """One screen: every package of ctl and every top-level module has its line; a file it names
    inside a package exists (the rest are in each package's docstring)."""
    folders, modules = _layout()
    packages = {name for name in os.listdir(os.path.join(ROOT, "ctl"))
                if os.path.isfile(os.path.join(ROOT, "ctl", name, "__init__.py"))}
    top = {name for name in os.listdir(os.path.join(ROOT, "ctl")) if name.endswith(".py")}
    assert folders == packages
    assert top <= modules
    assert not [m for m in modules if not os.path.isfile(os.path.join(ROOT, "ctl", m))]
    with open(os.path.join(ROOT, "BUILD.md")) as f:
        assert len(f.read().split("```", 2)[1].splitlines()) <= 45  # One screen.


def _python(code: str, *args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *(["-c", code] if code else []), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)


# A line of TensorFlow's C++ log at INFO: `2026-11-27 11:54:54.974786: I tensorflow/.../port.cc:153] ...`.
TF_INFO_LINE = re.compile(r"^\S+ \S+: I \S+:\d+\] ", re.MULTILINE)


@pytest.mark.slow  # A Python process of its own.
def test_import_ctl_leaves_tensorflows_log_level_to_the_process_and_the_cli_sets_it(tmp_path):
    # oneDNN's notice at import is an INFO line on every x86 CPU once oneDNN is asked for (TensorFlow
    # turns it on by itself only on CPUs with AVX-512 or AMX).
    env = {**{k: v for k, v in ctl_env().items() if k != "TF_CPP_MIN_LOG_LEVEL"},
           "TF_ENABLE_ONEDNN_OPTS": "1"}
    # `ctl.Task` imports the whole API, TensorFlow with it: its INFO line shows, the level is unset.
    imported = _python("import os, ctl; ctl.Task; print(os.environ.get('TF_CPP_MIN_LOG_LEVEL'))",
                       env=env)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip().splitlines()[-1] == "None"
    assert "oneDNN custom operations" in imported.stderr and TF_INFO_LINE.search(imported.stderr), \
        imported.stderr
    # The CLI keeps TensorFlow's C++ INFO lines (here: oneDNN's notice at import) out. A bad flag
    # ends before TensorFlow is imported; a config without its task ends after.
    result = _python(None, "-m", "ctl.run", "--mode=train", f"--model_dir={tmp_path / 'run'}", env=env)
    assert result.returncode == 2 and "Required bindings" in result.stderr, result.stderr
    assert not TF_INFO_LINE.search(result.stderr), result.stderr


@pytest.mark.slow  # A Python process of its own.
def test_the_tools_that_need_no_tensorflow_start_without_it():
    """`import ctl`, the launcher and the report's flag handling leave TensorFlow unimported."""
    result = _python("import sys, ctl, ctl.launch, ctl.report; "
                     "print(sorted(m for m in sys.modules if m.split('.')[0] in "
                     "('tensorflow', 'keras', 'tf_keras', 'orbit')))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.slow  # A Python process of its own.
def test_the_first_public_name_imports_the_whole_api():
    result = _python("import ctl; ctl.Task; import gin; "
                     "print(gin.get_configurable('ctl.with_warmup'), gin.get_configurable('ctl.hooks.Profile'))")
    assert result.returncode == 0, result.stderr


@pytest.mark.slow  # A Python process of its own.
def test_ctl_run_knows_every_ctl_configurable_before_it_parses(tmp_path):
    """A binding of a configurable no imported module touched (ctl.with_warmup) is not 'unknown'."""
    result = _python(None, "-m", "ctl.run", "--mode=train", f"--model_dir={tmp_path / 'run'}",
                     "--gin_bindings=ctl.with_warmup.warmup_steps=1",
                     "--gin_bindings=keras.optimizers.schedules.CosineDecay.decay_steps=5")
    assert result.returncode == 2
    assert "Required bindings for `Experiment` not provided in config: ['task']" in result.stderr
    assert "No configurable matching" not in result.stderr


def test_the_top_level_reads_as_the_concepts_and_the_hooks_are_ctl_hooks():
    import gin

    import ctl

    hooks = {"BestCheckpoint", "BestExporter", "CheckpointExporter", "EarlyStopping",
             "FinalExporter", "KerasCallbacks", "LatestExporter", "Profile", "WarmStart"}
    assert not hooks & set(ctl.__all__) and {"TrainLoopEnd", "Aggregation", "hooks"} <= set(ctl.__all__)
    ctl.import_api()  # As the first use of a public name, or ctl.run, does: registers them with gin.
    for name in hooks:
        assert gin.get_configurable(f"ctl.hooks.{name}") is getattr(ctl.hooks, name), name
    assert {"Hook", "HookProtocol", "Run", "StopRequest"} | hooks == set(ctl.hooks.__all__)
    assert gin.get_configurable("ctl.with_warmup") is ctl.with_warmup


def _ruff(root: str) -> subprocess.CompletedProcess:
    """`ruff check` on `root`'s ctl/, with `root`'s pyproject.toml (a second: the fast tier runs it)."""
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "ctl"], cwd=root,
                          capture_output=True, text=True, timeout=300)


def _mypy(root: str, cache: str) -> subprocess.CompletedProcess:
    """`mypy` on `root`'s ctl/, with `root`'s pyproject.toml (tens of seconds: `slow`)."""
    return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", cache], cwd=root,
                          capture_output=True, text=True, timeout=300)


def _ctl_copy_with_mistakes(tmp_path) -> str:
    """A copy of ctl/ (and pyproject.toml) whose utils/errors.py has an unused import and a
    wrong type."""
    shutil.copytree(os.path.join(ROOT, "ctl"), tmp_path / "ctl",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), tmp_path / "pyproject.toml")
    errors = tmp_path / "ctl" / "utils" / "errors.py"
    errors.write_text("import json\n" + errors.read_text() + "\n\nWRONG: int = 'a string'\n")
    return str(tmp_path)


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory):
    """One mypy cache for the module's two runs. The second (a copy of ctl/ elsewhere) checks
    ctl/ again, its files being others, and reads the standard library's and the typed
    dependencies' modules (optuna, SQLAlchemy, numpy, matplotlib: most of the ~1,000) from the
    cache: ~8 s instead of ~45 s."""
    return str(tmp_path_factory.mktemp("mypy"))


def test_ruff_passes_on_ctl():
    """The level is pyproject.toml's (`[tool.ruff]`); the suite runs it so `.ci/run` stays the
    README's one command."""
    done = _ruff(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


def test_an_unused_import_fails_ruff(tmp_path):
    done = _ruff(_ctl_copy_with_mistakes(tmp_path))
    assert done.returncode != 0 and "F401" in done.stdout and "`json` imported but unused" in done.stdout


# Both in one test process (xdist), the passing run first: it fills the cache.
@pytest.mark.slow
@pytest.mark.xdist_group("mypy_cache")
def test_mypy_passes_on_ctl(mypy_cache):
    """The level is pyproject.toml's (`[tool.mypy]`)."""
    done = _mypy(ROOT, mypy_cache)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.xdist_group("mypy_cache")
def test_a_wrong_type_fails_mypy(tmp_path, mypy_cache):
    done = _mypy(_ctl_copy_with_mistakes(tmp_path), mypy_cache)
    assert done.returncode != 0
    assert ('Incompatible types in assignment (expression has type "str", variable has type "int")'
            in done.stdout), done.stdout


def test_every_lazy_public_name_is_imported_for_type_checkers():
    """ctl/__init__.py's table of lazy names and its `if TYPE_CHECKING:` imports (what editors
    follow to `ctl.Trainer`) list the same names, each from the module that defines it."""
    import ast

    import ctl

    with open(os.path.join(ROOT, "ctl", "__init__.py")) as f:
        tree = ast.parse(f.read())
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
    typed = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom), ast.unparse(node)
        for alias in node.names:
            assert alias.asname == alias.name, f"{alias.name}: re-export it as `{alias.name} as {alias.name}`"
            module = node.module if node.module != "ctl" else f"ctl.{alias.name}"
            typed.setdefault(module, []).append(alias.name)
    lazy = {module: sorted(names) for module, names in ctl._MODULES.items()}
    lazy.update({f"ctl.{name}": [name] for name in ctl._SUBMODULES})
    assert {module: sorted(names) for module, names in typed.items()} == lazy


CITED = re.compile(r"(?<![\w/.])((?:tests|docs|bench|configs|experiments|tools|ctl)/[\w./-]*\w)(::test_\w+)?"
                   r"|(?<![\w/])(::test_\w+)")
DOTTED = re.compile(r"(?<![\w.])ctl(?:\.\w+)+")


def _defines(source: str, name: str) -> bool:
    return bool(re.search(rf"^\s*(?:def|class)\s+{name}\b|^\s*{name}\s*[:=]|\bimport\b.*\b{name}\b"
                          rf"|[\"']{name}[\"']", source, re.M))


def _unresolved_dotted(name: str):
    """`name` (ctl.a.b.C.attr) if its first part after the modules is not defined in the last module."""
    parts, here = name.split("."), os.path.join(ROOT, "ctl")
    i = 1
    while i < len(parts) and (os.path.isdir(os.path.join(here, parts[i]))
                              or os.path.isfile(os.path.join(here, parts[i] + ".py"))):
        here = os.path.join(here, parts[i]) + ("" if os.path.isdir(os.path.join(here, parts[i])) else ".py")
        i += 1
    if i == len(parts) or parts[i] == "NAME":  # A module, or a placeholder (`ctl.hooks.NAME`).
        return None
    with open(os.path.join(here, "__init__.py") if os.path.isdir(here) else here) as f:
        return None if _defines(f.read(), parts[i]) else name


def test_every_test_path_and_ctl_name_cited_in_ctl_exists():
    """A docstring or message in ctl/ citing a test, a file of the repo or a `ctl.` name that is gone
    (a module renamed, a test deleted) is a false claim, as in the docs (test_docs)."""
    missing = []
    for dirpath, _, names in os.walk(os.path.join(ROOT, "ctl")):
        for name in sorted(n for n in names if n.endswith(".py")):
            path = os.path.join(dirpath, name)
            where = os.path.relpath(path, ROOT)
            with open(path) as f:
                text = f.read()
            last_file = None
            for match in CITED.finditer(text):
                cited, test = match.group(1), match.group(2) or match.group(3)
                if cited:
                    last_file = cited
                    if not os.path.exists(os.path.join(ROOT, cited)):
                        missing.append(f"{where}: {cited}")
                        continue
                if test:
                    assert last_file, f"{where}: {test} names no file before it"
                    with open(os.path.join(ROOT, last_file)) as f:
                        if not re.search(rf"def {test[2:]}\b", f.read()):
                            missing.append(f"{where}: {last_file}{test}")
            missing += [f"{where}: {n}" for n in map(_unresolved_dotted, DOTTED.findall(text)) if n]
    assert not missing, "cited in ctl/ but not there:\n" + "\n".join(sorted(set(missing)))


def test_each_package_docstring_names_its_modules_and_no_other():
    """A package's docstring is its map: every module of the package in backticks, and no
    backticked bare lowercase name that is not one of them (a module that moved)."""
    import ast

    wrong = []
    for package in ("adapters", "cluster", "config", "core", "faults", "hooks", "model_dir", "sidecar", "utils"):
        directory = os.path.join(ROOT, "ctl", package)
        modules = {name[:-3] for name in os.listdir(directory)
                   if name.endswith(".py") and name != "__init__.py"}
        with open(os.path.join(directory, "__init__.py")) as f:
            named = set(re.findall(r"`([a-z_][a-z0-9_]*)`", ast.get_docstring(ast.parse(f.read())) or ""))
        named -= {"ctl"}
        wrong += [f"ctl/{package}: {m} not in its docstring" for m in sorted(modules - named)]
        wrong += [f"ctl/{package}: its docstring names `{m}`, no module of it" for m in sorted(named - modules)]
    assert not wrong, "\n".join(wrong)


def test_no_test_module_imports_another():
    """What tests share lives in tests/support/ (or a tests/*_tasks.py module of tasks), never in a test module."""
    importing = re.compile(r"^\s*(?:from tests\.test_\w+ import|import tests\.test_\w+)", re.M)
    offenders = []
    for name in sorted(os.listdir(os.path.join(ROOT, "tests"))):
        if name.endswith(".py"):
            with open(os.path.join(ROOT, "tests", name)) as f:
                offenders += [f"tests/{name}: {m.group(0).strip()}" for m in importing.finditer(f.read())]
    assert not offenders, "test modules imported by others:\n" + "\n".join(offenders)


# Where a model dir's names live. A file name is joined into a model dir where the base of a join
# (`os.path.join(base, ...)`, `f"{base}/..."`, `base + "/..."`) is reached as one: `x.path` (a
# ModelDir's), `x.directory` (the hooks' `run.directory`, a manager's dir), `model_dir`,
# `summary_dir`, or a ModelDir member (`x.train_dir`, `x.file(...)`). A
# checkpoint's files (`prefix + ".index"`, `".*"`, `".data-*"`) are named from its prefix there too.
# Joins into local staging or temporary dirs (named `local`, `temp`, `directory`, ...) pass.
# Outside the rule: ctl/model_dir/ itself, and ctl/sweep/ (an entry point, with its own sweep dir).
MODEL_DIR_BASES = {"path", "directory", "model_dir", "summary_dir"}
CHECKPOINT_SUFFIXES = (".index", ".data", ".*")
JOINS_ALLOWED_IN = ("ctl/model_dir/", "ctl/sweep/")


def _model_dir_members() -> set:
    with open(os.path.join(ROOT, "ctl", "model_dir", "layout.py")) as f:
        tree = ast.parse(f.read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelDir")
    return {n.name for n in cls.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}


def _model_dir_joins(source: str, members: set) -> list:
    """The lines of `source` that join a file name into a model dir (the rule above)."""
    def is_model_dir(node) -> bool:
        if isinstance(node, ast.Name):
            return node.id == "model_dir"
        if isinstance(node, ast.Attribute):
            return node.attr in members | MODEL_DIR_BASES
        if isinstance(node, (ast.BoolOp, ast.IfExp)):  # `self._local or self.summary_dir`
            return any(map(is_model_dir, node.values if isinstance(node, ast.BoolOp)
                           else (node.body, node.orelse)))
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in members)

    def text(node) -> str:
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "os.path.join" and node.args:
            joined = is_model_dir(node.args[0])
        elif isinstance(node, ast.JoinedStr):
            parts = node.values
            joined = any(isinstance(a, ast.FormattedValue) and (
                is_model_dir(a.value) and text(b).startswith("/") or text(b).startswith(CHECKPOINT_SUFFIXES))
                for a, b in zip(parts, parts[1:]))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            joined = (is_model_dir(node.left) and text(node.right).startswith(("/", "."))
                      or text(node.right).startswith(CHECKPOINT_SUFFIXES))
        else:
            continue
        if joined:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_file_name_is_joined_into_a_model_dir_outside_model_dir_py():
    """`ctl.model_dir` names every file of a model dir (its layout docstring): others ask it."""
    members, offenders = _model_dir_members(), []
    for dirpath, _, names in os.walk(os.path.join(ROOT, "ctl")):
        for name in sorted(names):
            relative = os.path.relpath(os.path.join(dirpath, name), ROOT).replace(os.sep, "/")
            if name.endswith(".py") and not relative.startswith(JOINS_ALLOWED_IN):
                with open(os.path.join(dirpath, name)) as f:
                    offenders += [f"{relative}:{line}" for line in _model_dir_joins(f.read(), members)]
    assert not offenders, ("file names joined into a model dir outside ctl/model_dir/ (give "
                           "ModelDir a name for each):\n" + "\n".join(offenders))


def test_the_model_dir_join_rule_sees_the_joins_it_replaced():
    """The rule above is not blind: each join model_dir.py took over would be found again."""
    joins = [
        'tf.io.gfile.rmtree(os.path.join(self.directory, name.rstrip("/")))',
        "path = os.path.join(self.manager.restore_directory.path, os.path.basename(path))",
        "upload(os.path.join(self._staging, file), os.path.join(self.directory, file))",
        "writer = os.path.join(self._local or self.summary_dir, relative_path)",
        "remote = os.path.join(self.summary_dir, os.path.relpath(local, self._local))",
        'remotes = tf.io.gfile.glob(path + ".*")',
        'found = tf.io.gfile.exists(path + ".index")',
        'log = f"{run.directory.train_dir}/log.txt"',
        'record = run.directory.file(BEST_DIR) + "/best.json"',
    ]
    for join in joins:
        assert _model_dir_joins(join, _model_dir_members()), join
    for staging in ['local = os.path.join(local, os.path.basename(remote))',
                    'path = os.path.join(directory, "probe")', 'key = TRAIN_INPUT + "/"']:
        assert not _model_dir_joins(staging, _model_dir_members()), staging
