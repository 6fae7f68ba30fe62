"""REINFORCE++-baseline estimator plugin for Relax."""
