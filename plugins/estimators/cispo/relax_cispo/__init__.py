"""CISPO estimator plugin for Relax."""
