"""The rl-variants trainer app: train, compare, eval and bench algorithm variants."""
