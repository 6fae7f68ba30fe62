"""GSPO estimator plugin for Relax."""
