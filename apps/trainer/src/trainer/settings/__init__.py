"""A run's settings: the layers (task lengths, a YAML file, dotted overrides) and their checks
(run_settings), and the reference `trainer config` prints (doc)."""

from trainer.settings.doc import describe
from trainer.settings.run_settings import (
    DEFAULT_TRAINING,
    RunSettings,
    build_settings,
    load_yaml,
    merge,
    parse_overrides,
    settings_from_user,
    user_settings,
)

__all__ = [
    "DEFAULT_TRAINING", "RunSettings", "build_settings", "describe", "load_yaml", "merge",
    "parse_overrides", "settings_from_user", "user_settings",
]
