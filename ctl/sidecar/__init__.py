"""Processes that watch a model dir: the sidecar evaluator, and continuous fine-tuning.

`scheduler` holds the `ContinuousEval` settings, the progress record and the
pure-Python policy that decides what to evaluate next; `continuous_eval` is the
TensorFlow side that watches a model dir and appends to metrics.jsonl
(`--mode=continuous_eval`), holding the model dir's evaluator role
(`EvaluatorRole`) so that in-line evaluation steps aside; `checkpoint_evaluator`
restores each checkpoint and evaluates it. `continuous_finetune` watches another run's
model dir the same way and fine-tunes from each of its checkpoints, each once, in order
(`python -m ctl.train --mode=continuous_train_and_eval`).
Nothing is re-exported here: the public API is `ctl`.
"""
