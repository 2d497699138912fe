"""The old spellings of engine settings: top-level `rollout.<key>`s that now live in `rollout.options`.

Read for one release, each with a one-line notice naming the new key (a FutureWarning: a notice for
the people who run `trainer`, shown by default); old run folders, whose config.yaml holds every one
at its default, resume without a notice (rl_core.config.RolloutConfig.from_dict, trainer.run.folder).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from rl_core.config import ConfigError, RolloutConfig
from rl_core.rollout.engines import engine_record

MOVED_ROLLOUT_KEYS = {
    "servers": "servers", "local_servers": "local_servers", "weights_url": "weights_url", "server_max_lag": "max_lag",
    "page_size_tokens": "page_size", "decode_slots": "slots", "prefill_chunk_tokens": "prefill_chunk",
    "steps_per_sync": "steps_per_sync", "kv_pages": "num_pages", "attention": "attention",
}
"""Old `rollout.<key>` spellings of engine settings -> their `rollout.options.<key>`: still read, with a
one-line notice, for one release (the paged engine's, given for an engine without them, were ignored
before and still are)."""
_OLD_DEFAULTS = {"servers": (), "local_servers": 0, "weights_url": None, "server_max_lag": 0,
                 "page_size_tokens": 16, "decode_slots": 64, "prefill_chunk_tokens": 64, "steps_per_sync": 8,
                 "kv_pages": 0, "attention": "auto"}
"""Their defaults then: what every run folder's config.yaml of those releases holds (saying nothing)."""
_PAGED_KNOBS = ("page_size_tokens", "decode_slots", "prefill_chunk_tokens", "steps_per_sync", "kv_pages", "attention")


def moved_into_options(data: dict[str, Any]) -> dict[str, Any]:
    """A rollout section `data` with the old spellings of engine settings moved into `options`, each with
    a one-line notice; at their old defaults (every old run folder's config.yaml holds them) they are
    dropped quietly, and the paged engine's knobs given for an engine without them with a notice, as
    they were ignored before."""
    given = {key: data[key] for key in MOVED_ROLLOUT_KEYS if key in data}
    if not given:
        return data
    data = {k: v for k, v in data.items() if k not in given}
    moved = {k: v for k, v in given.items()
             if not (v == _OLD_DEFAULTS[k] or (isinstance(v, list) and tuple(v) == _OLD_DEFAULTS[k]))}
    if not moved:
        return data
    options = dict(data.get("options") or {})
    try:
        new_tokens = int(data.get("max_new_tokens", RolloutConfig.max_new_tokens))
        record = engine_record(str(data.get("engine", "auto")), new_tokens)
        known = {f.name for f in dataclasses.fields(record.settings)}
    except (ConfigError, TypeError, ValueError):  # the config's own checks say what is wrong
        record, known = None, set(MOVED_ROLLOUT_KEYS.values())
    for old, value in moved.items():
        new = MOVED_ROLLOUT_KEYS[old]
        if new not in known and old in _PAGED_KNOBS:
            warnings.warn(f"rollout.{old} is deprecated and ignored: rollout.engine={record.name!r} has no setting "
                          f"{new!r} (remove it)", FutureWarning)
            continue
        if new in options:
            raise ConfigError(f"rollout.{old} (deprecated) and rollout.options.{new} are both set; keep "
                              f"rollout.options.{new}")
        warnings.warn(f"rollout.{old} is deprecated: write rollout.options.{new} (read for one more release)",
                      FutureWarning)
        options[new] = value
    return data | {"options": options}
