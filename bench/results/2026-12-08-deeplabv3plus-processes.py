import os, sys, json, hashlib
import numpy as np
import tensorflow as tf
import tf_keras
from official.core import exp_factory, task_factory
from official.vision import registry_imports  # noqa
from bench.model_garden_zoo import data, variants
from ctl.adapters import model_garden

exp = sys.argv[1]; out = sys.argv[2]; K = int(os.environ.get("EXTRA_UIDS", "0")); steps = int(os.environ.get("STEPS", "6"))
tf_keras.utils.set_random_seed(1)
tf.config.experimental.enable_op_determinism()
if os.environ.get("NO_GRAPPLER"): tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
params = model_garden.experiment_config(exp, params_override=variants.overrides(exp, steps) + data.data_overrides(exp, "/tmp/dl3/data"))
task = task_factory.get_task(params.task)
model = task.build_model()
opt = task.create_optimizer(params.trainer.optimizer_config, params.runtime)
ds = task.build_inputs(params.task.train_data)
it = iter(ds)
import hashlib as _h
batches = [next(it) for _ in range(steps)]
for _ in range(K):
    tf.constant(0.0)
class Rec:
    def __init__(s, o): s.o = o; s.g = None
    def apply_gradients(s, gv, **kw):
        gv = list(gv); s.g = [g for g, _ in gv]; return s.o.apply_gradients(gv, **kw)
    def __getattr__(s, n): return getattr(s.o, n)
rec = Rec(opt)
metrics = task.build_metrics(training=True)
@tf.function
def step(inputs):
    logs = task.train_step(inputs, model=model, optimizer=rec, metrics=metrics)
    return logs["loss"], rec.g
res = {"loss": [], "grads": [], "init": _h.sha1(b"".join(w.numpy().tobytes() for w in model.weights)).hexdigest()[:12], "batch": _h.sha1(b"".join(np.asarray(t).tobytes() for t in tf.nest.flatten(batches[0]))).hexdigest()[:12], "threads": [tf.config.threading.get_intra_op_parallelism_threads(), os.sched_getaffinity(0).__len__()]}
first = None
for b in batches:
    loss, grads = step(b)
    res["loss"].append(int(np.array(loss, np.float32).view(np.int32)))
    if first is None: first = [np.asarray(g) for g in grads]; np.savez(out + ".npz", *first)
    res["grads"].append([hashlib.sha1(np.asarray(g).tobytes()).hexdigest()[:10] for g in grads])
res["weights"] = [hashlib.sha1(w.numpy().tobytes()).hexdigest()[:10] for w in model.trainable_weights]
res["names"] = [w.name for w in model.trainable_weights]
res["fname"] = step.get_concrete_function(batches[0]).name.decode() if isinstance(step.get_concrete_function(batches[0]).name, bytes) else step.get_concrete_function(batches[0]).name
json.dump(res, open(out, "w"))
print("DONE", res["init"], res["batch"], res["threads"], res["loss"], res["fname"])
