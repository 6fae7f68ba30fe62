"""Every test must leave the process's SIGINT handler as it found it: a leaked ``SIG_IGN``
makes a later in-process run's Ctrl-C handling untestable (and hid which test leaked it, in
one CI run).  A test that changes it is named in pytest's warnings summary, and the handler
is put back so that the tests after it see Python's own."""

from __future__ import annotations

import signal
import warnings

import pytest


@pytest.fixture(autouse=True)
def _sigint_handler_kept(request):
    before = signal.getsignal(signal.SIGINT)
    yield
    after = signal.getsignal(signal.SIGINT)
    if after is not before and before is not None:  # None: a handler Python did not install
        signal.signal(signal.SIGINT, before)
        warnings.warn(f"{request.node.nodeid} left the SIGINT handler {after!r} (found {before!r}); put back",
                      stacklevel=1)
