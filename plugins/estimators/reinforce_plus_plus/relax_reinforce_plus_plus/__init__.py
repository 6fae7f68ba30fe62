"""REINFORCE++ estimator plugin for Relax."""
