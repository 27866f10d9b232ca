"""Choosing the `tf.distribute` strategy a run trains under.

`cpu_replicas=N` splits the host CPU into N logical devices, so that the
replica logic of `MirroredStrategy` can be tried on a machine without
accelerators. It must run before TensorFlow initializes its devices.
"""

import tensorflow as tf

from ctl.errors import UserError

STRATEGIES = ("default", "one_device", "mirrored")


def create_strategy(name: str = "default", cpu_replicas: int = 0) -> tf.distribute.Strategy:
    """Returns the strategy called `name` (one of `STRATEGIES`)."""
    if name not in STRATEGIES:
        raise UserError(f"Received strategy={name!r}. Expected one of: {', '.join(STRATEGIES)}.")
    if cpu_replicas < 0:
        raise UserError(f"--cpu_replicas ({cpu_replicas}) must be 0 or a positive integer.")
    if cpu_replicas:
        _split_cpu(cpu_replicas)
    if name == "default":
        return tf.distribute.get_strategy()
    gpus = tf.config.list_logical_devices("GPU")
    cpus = tf.config.list_logical_devices("CPU")
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy((gpus or cpus)[0].name)
    devices = [d.name for d in gpus] or [d.name for d in cpus[: max(cpu_replicas, 1)]]
    return tf.distribute.MirroredStrategy(devices)


def _split_cpu(count: int) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    wanted = [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
    current = tf.config.get_logical_device_configuration(cpu)
    if current is not None and len(current) == count:
        return
    try:
        tf.config.set_logical_device_configuration(cpu, wanted)
    except RuntimeError as error:
        raise UserError(
            f"cannot split the CPU into {count} devices after TensorFlow has started "
            f"({error}); set cpu_replicas before any TensorFlow op runs."
        ) from error


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this process writes checkpoints, summaries and configs."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True
    return resolver.task_type == "chief" or (
        resolver.task_type == "worker"
        and resolver.task_id == 0
        and "chief" not in resolver.cluster_spec().as_dict()
    )
