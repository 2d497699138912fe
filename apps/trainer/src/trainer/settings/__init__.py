"""A run's settings: their schemas and checks (schemas), the layers they are loaded from (task
lengths, a YAML file, dotted overrides: loading), and the reference `trainer config` prints (doc)."""

from trainer.settings.doc import describe
from trainer.settings.loading import build_settings, load_yaml, merge, parse_overrides, settings_from_user, user_settings
from trainer.settings.schemas import DEFAULT_TRAINING, RunSettings

__all__ = [
    "DEFAULT_TRAINING", "RunSettings", "build_settings", "describe", "load_yaml", "merge",
    "parse_overrides", "settings_from_user", "user_settings",
]
