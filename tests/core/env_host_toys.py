"""A stateful toy environment for the process host's tests (imported by spawned workers):
each episode counts its turns and, at its second turn, misbehaves as its prompt says."""

import os
import signal
import time

from relax_core.environments import Reply


class Unreadable(Exception):
    """Pickles, but does not unpickle (its __init__ needs two arguments, pickle passes one)."""

    def __init__(self, a, b):
        super().__init__(a)


class Episode:
    def __init__(self, mode):
        self.mode, self.turns = mode, 0

    def step(self, turn):
        self.turns += 1
        if self.turns == 2:
            if self.mode == "raise":
                raise KeyError("boom")
            if self.mode == "hang":
                time.sleep(60)
            if self.mode == "segv":
                os.kill(os.getpid(), signal.SIGSEGV)
            if self.mode == "junk":
                return "done"
            if self.mode == "slow":
                time.sleep(0.1)
            if self.mode == "unreadable":
                return Reply(messages=({"role": "user", "content": Unreadable("x", "y")},))
            if self.mode == "unpicklable":
                return Reply(messages=({"role": "user", "content": lambda: 0},))
        return Reply(messages=({"role": "user", "content": f"{self.mode} {self.turns} {os.getpid()}"},),
                     reward=float(self.turns))


class Counting:
    def prompt(self, text):
        """``text`` and the pid of the process it ran in; raises or hangs for those prompts."""
        if text == "prompt-raise":
            raise ValueError("no prompt for this row")
        if text == "prompt-hang":
            time.sleep(60)
        return f"{text} {os.getpid()}"

    def start(self, row):
        if row["prompt"] == "start":
            raise RuntimeError("no such game")
        return Episode(row["prompt"])


def build(params, config):
    return Counting()


def workers_only(params, config):
    """``build``, refusing to run in the trainer's (the main) process."""
    import multiprocessing

    if multiprocessing.parent_process() is None:
        raise AssertionError("the environment was built in the trainer's process")
    return Counting()


def broken(params, config):
    raise ValueError("cannot build")


def interrupted_once(params, config):
    """Killed by SIGINT while it builds when the file ``params`` exists (removing it), as a
    worker spawned off the main thread is by a Ctrl-C during its start-up; else ``build``."""
    if os.path.exists(params):
        os.remove(params)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return Counting()
