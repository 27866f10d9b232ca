"""The architecture as checked facts: one direction of dependency, BUILD.md's layout, and a
`ctl` package that imports TensorFlow only when a public name is used.

The import-linter contracts live in pyproject.toml (`[tool.importlinter]`):
entry points above the composition root, above the subsystems (sidecar,
comforts, faults, cluster: independent of each other), above core; inside core, the
controller over the Trainer over its evaluation over its loop functions over the runner
contract; no cycles.
"""

import os
import re
import shutil
import subprocess
import sys

from tests.cli import ROOT

LINT_IMPORTS = ("import sys; from importlinter.cli import lint_imports_command; "
                "sys.exit(lint_imports_command())")


def lint_imports(root: str) -> subprocess.CompletedProcess:
    """`lint-imports` on the `ctl` package under `root`, with `root`'s pyproject.toml."""
    return subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache"], cwd=root, capture_output=True,
        text=True, timeout=300, env={**os.environ, "PYTHONPATH": root},
    )


def test_import_contracts_hold():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_back_edge_into_a_subsystem_breaks_the_contracts(tmp_path):
    """core naming a subsystem (here the fault tolerance's step guard) is refused."""
    shutil.copytree(os.path.join(ROOT, "ctl"), tmp_path / "ctl",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), tmp_path / "pyproject.toml")
    trainer = tmp_path / "ctl" / "core" / "trainer.py"
    trainer.write_text(trainer.read_text().replace(
        "\nimport gin\n", "\nimport gin\nfrom ctl.faults import step_guard  # noqa\n", 1))
    result = lint_imports(str(tmp_path))
    assert result.returncode != 0
    assert "ctl.core is not allowed to import ctl.faults" in result.stdout
    assert "ctl.core.trainer -> ctl.faults.step_guard" in result.stdout


def _layout_modules():
    """The modules BUILD.md's layout tree names, as paths relative to ctl/."""
    with open(os.path.join(ROOT, "BUILD.md")) as f:
        text = f.read()
    tree = text.split("```", 2)[1]  # The first code block is the layout tree.
    modules, package = set(), None
    for line in tree.splitlines():
        match = re.match(r"^  (\s*)(\S+)", line)
        if not match:
            package = None if line.strip() and not line.startswith(" ") else package
            continue
        indent, name = len(match.group(1)), match.group(2)
        if name.endswith("/"):
            package = name.rstrip("/") if indent == 0 else package
        elif name.endswith(".py"):
            modules.add(f"{package}/{name}" if indent > 0 and package else name)
    return modules


def test_build_md_layout_names_every_module_of_ctl():
    on_disk = {
        os.path.relpath(os.path.join(dirpath, name), os.path.join(ROOT, "ctl"))
        for dirpath, _, names in os.walk(os.path.join(ROOT, "ctl"))
        for name in names if name.endswith(".py") and name != "__init__.py" or
        (name == "__init__.py" and dirpath == os.path.join(ROOT, "ctl"))
    }
    assert _layout_modules() == on_disk


def _python(code: str, *args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *(["-c", code] if code else []), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)


def test_import_ctl_leaves_tensorflows_log_level_to_the_process_and_the_cli_sets_it():
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = ROOT
    result = _python("import os, ctl; ctl.Task; print(os.environ.get('TF_CPP_MIN_LOG_LEVEL'))",
                     env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "None"
    # The CLI keeps TensorFlow's C++ INFO lines (here: oneDNN's notice at import) out.
    result = _python(None, "-m", "ctl.run", "--mode=trian", env=env)
    assert result.returncode == 2 and "--mode" in result.stderr, result.stderr
    assert "oneDNN custom operations" not in result.stderr
    assert "oneDNN custom operations" in _python("import tensorflow", env=env).stderr


def test_the_tools_that_need_no_tensorflow_start_without_it():
    """`import ctl`, the launcher and the report's flag handling leave TensorFlow unimported."""
    result = _python("import sys, ctl, ctl.launch, ctl.report; "
                     "print(sorted(m for m in sys.modules if m.split('.')[0] in "
                     "('tensorflow', 'keras', 'tf_keras', 'orbit')))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_first_public_name_imports_the_whole_api():
    result = _python("import ctl; ctl.Task; import gin; "
                     "print(gin.get_configurable('ctl.with_warmup'), gin.get_configurable('ctl.hooks.Profile'))")
    assert result.returncode == 0, result.stderr


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
