"""Held-out greedy accuracy and unbiased pass@k (heldout): what a run evaluates on its schedule and
at its end. The evaluation of a saved run folder (`trainer eval --run DIR`) builds on the run and
lives beside it, in trainer.run.saved_run.
"""

from trainer.evaluate.heldout import evaluate, generate_episodes, generate_texts, pass_at_k

__all__ = ["evaluate", "generate_episodes", "generate_texts", "pass_at_k"]
