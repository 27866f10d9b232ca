"""`trained_dir`: finished runs of tests/regression.gin, each made once per test process."""

import pytest

from tests.support.env import TEST_GIN
from tests.support.processes import run_ctl


@pytest.fixture(scope="session")
def trained_dir(tmp_path_factory):
    """`trained_dir(train_steps=20)`: the model dir of `python -m ctl.run --mode=train` on
    tests/regression.gin to `train_steps` (a checkpoint and summaries every 10 steps, its
    configs), made at the first call for those steps. Shared: read it, or copy it to change it."""
    made = {}

    def trained(train_steps=20):
        if train_steps not in made:
            model_dir = str(tmp_path_factory.mktemp(f"trained{train_steps}"))
            result = run_ctl("--mode=train", f"--model_dir={model_dir}", f"--gin_file={TEST_GIN}",
                             f"--gin_bindings=ctl.Schedule.train_steps={train_steps}")
            assert result.returncode == 0, result.stderr
            made[train_steps] = model_dir
        return made[train_steps]

    return trained
