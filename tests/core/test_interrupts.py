"""``spawn_worker`` ignores SIGINT only while the child starts, then puts back exactly the
parent's handler (a leaked ``SIG_IGN`` would make every later Ctrl-C do nothing)."""

from __future__ import annotations

import multiprocessing as mp
import operator
import signal
import threading

import pytest

from relax_core.run import interrupts


@pytest.fixture
def sigint_kept():
    before = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, before)


def _spawn():
    p, conn = interrupts.spawn_worker(mp.get_context("spawn"), operator.truth, (), "relax-test-worker")
    p.join(timeout=60)
    conn.close()
    return p


def test_the_parents_python_handler_is_put_back(sigint_kept):
    def mine(*_):
        pass

    signal.signal(signal.SIGINT, mine)
    assert _spawn().exitcode == 0
    assert signal.getsignal(signal.SIGINT) is mine


def test_a_handler_installed_outside_python_becomes_pythons_default(sigint_kept, monkeypatch):
    """``signal.signal`` returns ``None`` for a handler it did not install (a C library's);
    before the fix that ``None`` meant "nothing to restore" and SIGINT stayed ignored."""
    real = signal.signal
    calls = []

    def from_c_first(sig, handler):
        old = real(sig, handler)
        calls.append(handler)
        return None if len(calls) == 1 else old

    monkeypatch.setattr(interrupts.signal, "signal", from_c_first)
    _spawn()
    monkeypatch.undo()
    assert calls == [signal.SIG_IGN, signal.default_int_handler]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_off_the_main_thread_the_handler_is_not_touched(sigint_kept):
    def mine(*_):
        pass

    signal.signal(signal.SIGINT, mine)
    out = []
    t = threading.Thread(target=lambda: out.append(_spawn().exitcode))
    t.start()
    t.join(timeout=90)
    assert out == [0]
    assert signal.getsignal(signal.SIGINT) is mine
