"""Configuration and flags, below core and above the model dir.

`gin_config` is gin at the edges (clear errors; `config.gin` and
`operative_config.gin` in the model dir); `gin_text` checks the `--gin.` flags,
gin files and their syntax before TensorFlow is imported; `arguments` is
`ctl.check_arguments` (type, `Range` and `Check` declared on a configurable's
arguments); `run_plan` is `MODES` and `RunPlan`: what a process does for its mode
and cluster, decided once.
"""
