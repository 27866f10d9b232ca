"""Choosing the `tf.distribute` strategy a run trains under, and serving tasks.

`cpu_replicas=N` splits the host CPU into N logical devices, so that the
replica logic of `MirroredStrategy` can be tried on a machine without
accelerators. It must run before TensorFlow initializes its devices, as must
the creation of a multi-worker strategy: `ctl.run` creates the strategy first.

Multi-process strategies take the cluster from a validated TF_CONFIG
(`ctl.cluster.tf_config.ClusterConfig`); the evaluator is never part of their cluster.
"""

from typing import Optional

import tensorflow as tf

from ctl.cluster.tf_config import STRATEGIES, ClusterConfig
from ctl.utils.errors import UserError, first_line, require_choice

# More logical CPU devices than this only rehearse replica logic more slowly: with
# --cpu_replicas=100000 TensorFlow spends minutes setting the devices up.
MAX_CPU_REPLICAS = 64


def create_strategy(name: str = "default", cpu_replicas: int = 0,
                    cluster: Optional[ClusterConfig] = None,
                    tpu: Optional[str] = None) -> tf.distribute.Strategy:
    """Returns the strategy called `name` (one of `STRATEGIES`).

    Args:
        name: the strategy (`--strategy`), one of `STRATEGIES`.
        cpu_replicas: split this machine's CPU into this many logical devices (0: do not; at most `MAX_CPU_REPLICAS`).
        cluster: the validated TF_CONFIG for the cluster strategies, or None.
        tpu: the TPU `tpu` connects to (a name or `grpc://` address, as Model Garden's `--tpu`); None: the
            environment's (TPU_NAME, or a TPU VM's own).

    Raises:
        UserError: an unknown name, or a `cpu_replicas` out of range.
    """
    require_choice("strategy", name, STRATEGIES)
    if not 0 <= cpu_replicas <= MAX_CPU_REPLICAS:
        raise UserError(f"--cpu_replicas ({cpu_replicas}) must be between 0 and "
                        f"{MAX_CPU_REPLICAS}: it splits this machine's CPU into that many "
                        "logical devices (try 2).")
    if cpu_replicas:
        _split_cpu(cpu_replicas)
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "multi_worker_mirrored":
        # Without TF_CONFIG this is one worker over the local devices.
        resolver = _resolver(cluster) if cluster else None
        return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    if name == "parameter_server":
        if cluster is None:
            raise UserError("--strategy=parameter_server needs TF_CONFIG naming chief, worker and ps tasks.")
        return tf.distribute.ParameterServerStrategy(_resolver(cluster))
    if name == "tpu":
        return _tpu_strategy(tpu)
    gpus = tf.config.list_logical_devices("GPU")
    cpus = tf.config.list_logical_devices("CPU")
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy((gpus or cpus)[0].name)
    devices = [d.name for d in gpus] or [d.name for d in cpus[: max(cpu_replicas, 1)]]
    return tf.distribute.MirroredStrategy(devices)


def serve(cluster: ClusterConfig) -> None:
    """Runs this worker or ps task's server for parameter-server training; never returns.

    The coordinator (the chief) sends it variables and steps; a cluster
    manager, or `ctl.launch`, stops it when training is over.

    Args:
        cluster: the validated TF_CONFIG (`ctl.cluster.tf_config.read_tf_config`).
    """
    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster.training_cluster()),
        job_name=cluster.task_type,
        task_index=cluster.task_id,
        protocol="grpc",
        start=True,
    )
    server.join()


def _resolver(cluster: ClusterConfig):
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster.training_cluster()),
        task_type=cluster.task_type,
        task_id=cluster.task_id,
        rpc_layer="grpc",
    )


def _tpu_strategy(tpu: Optional[str]) -> tf.distribute.Strategy:
    """A TPUStrategy on `tpu`, else the TPU named by the environment (TPU_NAME, or a local TPU VM)."""
    where = f"--tpu={tpu}" if tpu else "--strategy=tpu"
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or None)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, tf.errors.OpError) as error:
        raise UserError(
            f"{where} found no TPU ({first_line(error)}); run on a TPU VM, "
            "or name a TPU this host reaches (--tpu, TPU_NAME)."
        ) from error
    return tf.distribute.TPUStrategy(resolver)


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


