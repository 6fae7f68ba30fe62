"""Module-level scorers for the reward-stage tests (importable by spawned reward workers:
``tests/core`` is on ``sys.path`` via ``conftest.py`` and workers inherit ``sys.path``)."""

import os
import signal
import time


def exact(response, label, metadata):
    """1 if the response equals the label, else 0; sleeps ``metadata['sleep']`` s first."""
    time.sleep(metadata.get("sleep", 0))
    return float(response == str(label))


def always_raise(response, label, metadata):
    raise RuntimeError("this scorer always fails")


def sleep_past_timeout(response, label, metadata):
    time.sleep(3600)
    return 1.0


def hang_on_request(response, label, metadata):
    """Hangs (a busy loop, as a stuck sympy call would) when the response is 'hang'."""
    while response == "hang":
        pass
    return 1.0


def exit_worker(response, label, metadata):
    os._exit(3)


def bad_value(response, label, metadata):
    return {"nan": float("nan"), "str": "1.0", "bool": True}[response]


def none_scorer(response, label, metadata):
    return None


def pid(response, label, metadata):
    return float(os.getpid())


def slow_factory(params, config):
    """A scorer factory that takes 1 s to build (a cold import), then scores instantly."""
    time.sleep(1.0)
    return exact


def build_exact(params, config):
    return exact


def build_always_raise(params, config):
    return always_raise


def build_needs_url(params, config):
    if not getattr(config, "rm_url", None):
        raise ValueError("needs --rm-url")
    return exact


def echo_prompt(response, label, metadata):
    """1 if the prompt the scorer sees is the label."""
    return float(metadata.get("prompt") == label)


def length(response, label, metadata):
    """The response's length in characters; unscored (None) when it is empty."""
    return float(len(response)) if response else None


def build_length(params, config):
    return length


def batch_len(responses, labels, metadata):
    """Batched: 100 × (samples in this call) + the response's length, so a test sees how many
    samples each call got; a response 'bad' gets a string, 'nan' a NaN."""
    special = {"bad": "x", "nan": float("nan")}
    return [special.get(r, 100.0 * len(responses) + len(r)) for r in responses]


def build_batch_len(params, config):
    return batch_len


def batch_wrong_length(responses, labels, metadata):
    return [1.0]


def build_batch_wrong_length(params, config):
    return batch_wrong_length


def batch_sleep(responses, labels, metadata):
    time.sleep(3600)


def build_batch_sleep(params, config):
    return batch_sleep


def gullible_factory(params, config):
    """A model-based scorer fooled by everything: 1 for any response."""
    return lambda response, label, metadata: 1.0


def discerning_factory(params, config):
    """A model-based scorer that rewards only 'The answer is <label>.'-like responses."""
    return lambda response, label, metadata: float(f"answer is {label}" in response)


class InterruptedWhileStarting:
    """A scorer (1.0 for everything) whose unpickling in a reward worker kills that worker
    with SIGINT when the file ``marker`` exists (removing it unless ``every_time``), as a
    Ctrl-C does to a worker spawned off the main thread during its start-up."""

    def __init__(self, marker, every_time=False):
        self.marker, self.every_time = marker, every_time

    def __setstate__(self, state):
        self.__dict__.update(state)
        if os.path.exists(self.marker):
            if not self.every_time:
                os.remove(self.marker)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)

    def __call__(self, response, label, metadata):
        return 1.0
