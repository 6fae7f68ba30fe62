"""Fixtures of the core's tests: a clean plugin environment and throwaway registries."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from relax_core.host.plugins import load_registry  # noqa: E402
from relax_core_test_toys import infra_plugin  # noqa: E402


@pytest.fixture(autouse=True)
def _clean_plugin_env(monkeypatch):
    for var in ("RELAX_STRICT_PLUGINS", "RELAX_LOAD_PLUGINS", "RELAX_DISABLE_PLUGINS", "RELAX_DEBUG_PLUGINS"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def registry_with():
    """``registry_with(*plugins)``: a registry of the engine/backend infra plugin plus the
    given ``(name, obj[, dist, version])`` plugins, without entry points."""
    def build(*plugins, strict=None):
        return load_registry([("infra", infra_plugin(), "relax-infra", "1.0"), *plugins],
                             entry_points=False, strict=strict)
    return build
