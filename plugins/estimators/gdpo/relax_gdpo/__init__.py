"""GDPO estimator plugin for Relax."""
