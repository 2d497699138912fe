"""Reward functions in TRL's signature: keywords, the row's columns by name, one float (or None) per
completion. `trainer train` loads them as `examples/bring-your-own-task/my_rewards.py:exact`."""


def exact(completions, answer, **kwargs):
    """1.0 when the completion is the reference sum, else 0.0. `answer` is the row's reference in every
    shape (here TRL's `solution`; verl's `reward_model.ground_truth`); `solution` itself is there too."""
    return [1.0 if completion.strip() == str(reference) else 0.0 for completion, reference in zip(completions, answer)]


def brevity(completions, completion_ids, **kwargs):
    """-0.1 per token beyond 4 (the answer, the end-of-sequence token and some slack)."""
    return [-0.1 * max(0, len(ids) - 4) for ids in completion_ids]


def carries(completions, answer, **kwargs):
    """The same check, given more weight on sums that carry (config.yaml routes it to data_source carry)."""
    return exact(completions, answer)
