"""`trainer eval`: held-out greedy accuracy and unbiased pass@k (heldout), and the evaluation of
a saved run (saved_run).

Only heldout is re-exported here: trainer.build evaluates with it, and saved_run builds a run's
policy with trainer.build, so importing saved_run here would make a circle; import it as
`trainer.evaluate.saved_run`.
"""

from trainer.evaluate.heldout import evaluate, generate_episodes, generate_texts, pass_at_k

__all__ = ["evaluate", "generate_episodes", "generate_texts", "pass_at_k"]
