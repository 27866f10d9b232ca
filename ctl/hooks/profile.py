"""`ctl.hooks.Profile`: a TensorBoard profile of chosen train steps, with TensorFlow's profiler.

    ctl.Experiment.hooks = [@ctl.hooks.Profile()]
    ctl.hooks.Profile.start_step = 200
    ctl.hooks.Profile.num_steps = 100

The profiler starts after the first train loop that ends at or past
`start_step` and stops after the first one that ends at or past `start_step +
num_steps`: it covers whole loops (`ctl.Schedule.steps_per_loop`), the steps
`[first loop end, last loop end)`, which include the chosen ones when
`start_step` and `num_steps` are multiples of `steps_per_loop`. Starting after
a loop keeps the first loop's tracing out of the profile. The trace lands in
`<model_dir>/train/plugins/profile/<run>/`, TensorBoard's Profile tab for the
`train` run (with the `tensorboard-plugin-profile` package installed).

Cost: nothing when the hook is not listed; when listed, one comparison per
train loop outside the window, and the profiler's own overhead inside it
(TensorFlow records every op; expect the profiled loops to run slower).
Runs on the chief only.
"""

from typing import Optional

import gin
import tensorflow as tf

from ctl.utils import console
from ctl.utils.errors import UserError
from ctl.core.hook_protocol import Hook, Run

PROFILE_DIR = "plugins/profile"  # In the train dir: TensorBoard's run, the profiler's layout.


@gin.configurable(module="ctl.hooks")
class Profile(Hook):
    """Profiles train steps `[start_step, start_step + num_steps)`, rounded out to whole loops.

    Args:
        start_step: the first global step profiled (an integer >= 0).
        num_steps: how many steps to profile (an integer >= 1).

    Raises:
        UserError: a value out of range.
    """

    def __init__(self, start_step: int = 10, num_steps: int = 10):
        for name, value, low in (("start_step", start_step, 0), ("num_steps", num_steps, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise UserError(f"ctl.hooks.Profile.{name} ({value!r}) must be an integer >= {low}.")
        self.start_step = start_step
        self.num_steps = num_steps
        self.logdir: Optional[str] = None
        self._started_at: Optional[int] = None
        self._done = False

    def bind(self, run: Run) -> None:
        """Sets the profile's log dir: the run's `train/` summaries.

        Args:
            run: the run's `ctl.hooks.Run` (model dir, model, step, stop request), kept as `self.run`.
        """
        super().bind(run)
        self.logdir = run.directory.train_dir  # The profiler adds `PROFILE_DIR`.

    def on_train_loop_end(self, unused_logs) -> None:
        """Starts the profiler once the step reaches `start_step`; stops it after `num_steps`.

        Args:
            unused_logs: the train loop's results (not read).
        """
        if self._done or not self.run.chief:
            return
        step = self.run.step
        if self._started_at is None:
            if step >= self.start_step + self.num_steps:
                self._done = True  # Resumed past the window: nothing to profile.
            elif step >= self.start_step:
                tf.profiler.experimental.start(self.logdir)
                self._started_at = step
                console.info("profile", "profiling from step %d until step %d or later",
                             step, self.start_step + self.num_steps, step=step)
        elif step >= self.start_step + self.num_steps:
            self._stop(step)

    def on_trial_close(self, unused_logs) -> None:
        """Stops a profile still running when the run ends.

        Args:
            unused_logs: the last evaluation's (or train loop's) results (not read).
        """
        if self._started_at is not None and not self._done:
            self._stop(self.run.step)

    def _stop(self, step: int) -> None:
        tf.profiler.experimental.stop()
        self._done = True
        console.info("profile", "profiled steps %d-%d: %s/plugins/profile", self._started_at,
                     step, self.logdir, step=step)
