"""Shared fixtures of the Ray tests: one local Ray (3 logical CPUs, 127.0.0.1, token auth off) per
session and a tiny prompt file (helpers: relax_ray_helpers)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from relax_authoring.testing.fixtures import tiny_model_dir  # noqa: F401  (session fixture)

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parent):  # relax_ray_helpers, relax_ray_scorers, train_helpers (appended: other dirs' `conftest` stays theirs)
    if str(path) not in sys.path:
        sys.path.append(str(path))

from train_helpers import prompts_file  # noqa: E402,F401  (fixture)


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray with 3 logical CPUs (a training rank, an engine, a teacher); `relax train --launcher ray` reuses it."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray = pytest.importorskip("ray")
    if ray.is_initialized():  # started by another test of this session: keep it
        yield ray
        return
    ray.init(num_cpus=3, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    yield ray
    ray.shutdown()
