"""RLOO estimator plugin for Relax."""
