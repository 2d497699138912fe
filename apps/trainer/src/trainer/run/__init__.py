"""`trainer train`: a run from settings to learner (train), its run folder's files and rules
(folder), a saved run's policy read back (policy), and prompts fitted to the context (prompt_lengths)."""

from trainer.run.folder import RUN_FILES, refuse_changed_settings, settings_of_run
from trainer.run.policy import load_run_policy
from trainer.run.train import load_task, plural, policy_evaluation, readable_run, train_run

__all__ = [
    "RUN_FILES", "load_run_policy", "load_task", "plural", "policy_evaluation", "readable_run",
    "refuse_changed_settings", "settings_of_run", "train_run",
]
