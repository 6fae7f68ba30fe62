"""Helpers of the third-party plugin tests: install a plugin package into a throwaway
directory (never into the shared environment) and run the `relax` CLI with it visible."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from relax_authoring.testing.fixtures import tiny_model_dir  # noqa: F401  (session fixture)

RELAX_PLUGIN_ENV = ("RELAX_STRICT_PLUGINS", "RELAX_LOAD_PLUGINS", "RELAX_DISABLE_PLUGINS")


class Site:
    """A `pip install --target` directory and the environment that makes it importable."""

    def __init__(self, path: Path):
        self.path = path
        env = {k: v for k, v in os.environ.items() if k not in RELAX_PLUGIN_ENV}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path), env.get("PYTHONPATH")]))
        self.env = env

    def install(self, *packages: Path) -> None:
        """``pip install --no-deps --target``, without build isolation (no package index
        needed) when this environment has setuptools."""
        isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
        res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", *isolation,
                              "--target", str(self.path), *map(str, packages)], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr

    def run(self, *args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        """Run ``python *args`` with the site on ``PYTHONPATH``."""
        return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=self.env,
                              cwd=cwd, timeout=timeout)

    def relax(self, *args: str, **kw) -> subprocess.CompletedProcess:
        """Run the ``relax`` CLI (as ``python -m cli.main``)."""
        return self.run("-m", "cli.main", *args, **kw)


@pytest.fixture(scope="module")
def make_site(tmp_path_factory):
    return lambda name: Site(tmp_path_factory.mktemp(name))
