"""A reward function that reads the episode (docs/multi-turn.md): the environment's return."""


def episode_return(prompts, completions, *, episode, **_):
    """The sum of the environment's per-turn rewards, one value per episode."""
    return [sum(e["rewards"]) for e in episode]
