"""Evaluation: the metrics of one evaluation set (``metrics``: pass@k, maj@k, intervals) and
``relax eval`` (``run``), shared by the in-training evaluation."""
