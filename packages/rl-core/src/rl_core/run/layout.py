"""The names of a run folder's files: the one place every writer and reader takes them from.

A run folder holds the user's settings (`CONFIG`), what its checkpoints mean
(`SETTINGS_AT_START`), the checkpoints and those that failed to restore, the metrics,
samples and TensorBoard events the recorder writes, the trainer's held-out
evaluation before training and summary after it, and `trainer show`'s plots.
"""

CONFIG = "config.yaml"
"""The user's settings file, or the resolved settings the run was started with."""
SETTINGS_AT_START = "settings_at_start.json"
"""The resolved settings at the first start: what the checkpoints mean."""
CHECKPOINTS = "checkpoints"
"""Orbax checkpoints, one folder per saved step."""
CORRUPT_CHECKPOINTS = "checkpoints-corrupt"
"""Beside the checkpoints folder: checkpoints that did not restore, kept for inspection."""
TENSORBOARD = "tensorboard"
METRICS = "metrics.jsonl"
SAMPLES = "samples.jsonl"
EVAL_BEFORE = "eval_before.json"
SUMMARY = "summary.json"
PLOTS = "plots"
"""`trainer show`'s PNG curves of the run."""
SFT_METRICS = "sft_metrics.jsonl"
"""The supervised warm start's metrics (one line per step), when the run performed one."""

RUN_FILES = (CHECKPOINTS, SETTINGS_AT_START, CORRUPT_CHECKPOINTS, TENSORBOARD, METRICS, SAMPLES, EVAL_BEFORE, SUMMARY,
             PLOTS, SFT_METRICS)
"""Everything a run writes into its folder besides `CONFIG`: what a new run must not find there."""

RECORDS = (CONFIG, SETTINGS_AT_START, METRICS, SAMPLES, EVAL_BEFORE, SUMMARY)
"""The files that tell what a run did (no checkpoints): what `rl_core.run.records` reads."""
