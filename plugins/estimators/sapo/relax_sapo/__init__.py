"""SAPO estimator plugin for Relax."""
