"""M2PO estimator plugin for Relax."""
