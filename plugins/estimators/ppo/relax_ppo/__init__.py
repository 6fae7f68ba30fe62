"""PPO estimator plugin for Relax (critic + GAE)."""
