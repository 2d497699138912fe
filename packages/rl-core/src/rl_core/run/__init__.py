"""A run's files and records: checkpoints, metrics, sinks, TensorBoard events, storage, progress, faults."""

# The names the apps and algorithm packages import from this wing (loaded on first use, so importing the wing stays light).
from rl_core._faces import lazy_face  # noqa: E402

__getattr__, __dir__, _LAZY = lazy_face(__name__, {
    "rl_core.run.checkpoint": ("remove_unfinished_saves", "saved_steps"),
    "rl_core.run.console_samples": ("samples_table",),
    "rl_core.run.faults": ("fault_point",),
    "rl_core.run.files": ("RunFileError", "atomic_write_text", "read_jsonl"),
    "rl_core.run.layout": (
        "CHECKPOINTS", "CONFIG", "CORRUPT_CHECKPOINTS", "EVAL_BEFORE", "METRICS", "PLOTS", "RUN_FILES",
        "SETTINGS_AT_START", "SFT_METRICS", "SUMMARY",
    ),
    "rl_core.run.progress": ("ProgressBar",),
    "rl_core.run.records": ("RunRecords", "open_records"),
    "rl_core.run.storage": ("StorageError", "is_url"),
})
__all__ = sorted(_LAZY)
