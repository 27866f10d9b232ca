"""Beyond one machine: clusters, distribution strategies and cross-replica results.

`tf_config` validates TF_CONFIG, `run_plan` decides what each process runs (the modes, the
`RunPlan` and its one maker, `run_plan.plan`), `distribute` creates the `tf.distribute`
strategy (mirrored, multi-worker, parameter servers, TPU) and serves non-training tasks,
`peers` names a lost peer in one line, and `reducers` combine eval results that Keras
metrics cannot hold over replicas and workers. Nothing is re-exported here: the public API is `ctl`.
"""
