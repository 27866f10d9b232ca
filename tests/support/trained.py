"""`trained_dir`: finished runs of tests/regression.gin, each made once per test process."""

import gin
import pytest

from tests.support.env import TEST_GIN


@pytest.fixture(scope="session")
def trained_dir(tmp_path_factory):
    """`trained_dir(train_steps=20)`: the model dir of a `train` run of tests/regression.gin to
    `train_steps` (a checkpoint and summaries every 10 steps, its configs and run-finished
    marker), trained in this process at the first call for those steps. Shared: read it, or
    copy it to change it. Call it before the test parses a config of its own."""
    import ctl
    from ctl.config import gin_config as config

    made = {}

    def trained(train_steps=20):
        if train_steps not in made:
            model_dir = str(tmp_path_factory.mktemp(f"trained{train_steps}"))
            config.parse([TEST_GIN], [f"ctl.Schedule.train_steps = {train_steps}"])
            try:
                ctl.run_experiment("train", model_dir)
            finally:
                gin.clear_config()
            made[train_steps] = model_dir
        return made[train_steps]

    return trained
