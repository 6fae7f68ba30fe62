"""Shared fixtures of the Ray tests: one local Ray (2 CPUs, 127.0.0.1, token auth off) per
session and a tiny prompt file (helpers: relax_ray_helpers)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from relax_core.testing.fixtures import tiny_model_dir  # noqa: F401  (session fixture)

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # relax_ray_helpers, relax_ray_scorers (appended: other dirs' `conftest` stays theirs)
    sys.path.append(str(HERE))


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray with 2 logical CPUs; `relax train --launcher ray` reuses it."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray = pytest.importorskip("ray")
    if ray.is_initialized():  # started by another test of this session: keep it
        yield ray
        return
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def prompts_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("data") / "prompts.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"What is {i} + {i + 1}?", "label": str(2 * i + 1)}) + "\n"
                         for i in range(8)))
    return p
