"""The golden tests import ``golden`` (this directory) and reuse the Ray tests' local Ray."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray with 3 logical CPUs (as tests/ray's fixture, whose teacher test needs 3 bundles), shared with later tests."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(num_cpus=3, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    yield ray
