"""Pure math: advantages, returns, policy and value losses, KL estimators, loss aggregation."""
