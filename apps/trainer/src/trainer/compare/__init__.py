"""`trainer compare`: variants x seeds from one base policy (sweep), the comparison's folder,
its report, plots and statistics."""

from trainer.compare.sweep import (
    COMPARE_DEFAULTS,
    DEFAULT_SEEDS,
    MINI_BATCHES,
    compare,
    named_variants,
    variant_settings,
)

__all__ = ["COMPARE_DEFAULTS", "DEFAULT_SEEDS", "MINI_BATCHES", "compare", "named_variants", "variant_settings"]
