"""Sidecar evaluation: a process that evaluates every checkpoint a trainer writes.

`scheduler` holds the `ContinuousEval` settings, the progress record and the
pure-Python policy that decides what to evaluate next; `continuous_eval` is the
TensorFlow side that watches a model dir and appends to metrics.jsonl
(`--mode=continuous_eval`), holding the model dir's evaluator role
(`EvaluatorRole`) so that in-line evaluation steps aside; `checkpoint_evaluator`
restores each checkpoint and evaluates it.
Nothing is re-exported here: the public API is `ctl`.
"""
