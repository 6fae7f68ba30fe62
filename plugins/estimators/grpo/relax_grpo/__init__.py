"""GRPO estimator plugin for Relax."""
