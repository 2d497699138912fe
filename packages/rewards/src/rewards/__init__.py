"""rewards: verifiable reward functions and the reward manager."""
