"""Configuration and flags, below core and above the model dir.

`gin_config` is gin at the edges (clear errors; `config.gin` and
`operative_config.gin` in the model dir); `gin_text` checks the `--gin.` flags,
gin files and their syntax before TensorFlow is imported; `arguments` is
`ctl.check_arguments` (type, `Range` and `Check` declared on a configurable's
arguments). The modes a run accepts (`ctl.MODES`) are the run's plan's
(`ctl.cluster.run_plan`).
"""
