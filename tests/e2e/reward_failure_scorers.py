"""Failing scorers for the end-to-end reward-failure tests (importable by the reward worker
processes, which get the parent's ``sys.path``)."""

import time


def always_raise(response, label, metadata):
    raise RuntimeError("this scorer always fails")


def sleep_past_timeout(response, label, metadata):
    time.sleep(3600)
    return 1.0
