"""Evaluation metrics of one evaluation set (``metrics``: pass@k, maj@k, intervals), shared by
``relax eval`` (:mod:`cli.eval`) and the in-training evaluation."""
