"""Every benchmark script still runs (``--smoke``: tiny sizes).  Benchmarks are not tests:
nothing here checks a timing, only that each script exits 0 and prints its table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
import run_all  # noqa: E402


def _smoke(name: str) -> subprocess.CompletedProcess:
    part = next(p for p in run_all.SUITE if p[0] == name)
    _, interp, script, _, smoke, _ = part
    if not Path(interp).exists():
        pytest.skip(f"{interp} is not installed here")
    if not (BENCH / script).exists():
        pytest.skip(f"benchmarks/{script} has not landed")
    if "--smoke" in smoke and not run_all.has_smoke_mode(BENCH / script):
        pytest.skip(f"benchmarks/{script} has no --smoke mode yet")
    return subprocess.run([str(interp), str(BENCH / script), *smoke], capture_output=True, text=True,
                          cwd=BENCH.parent, timeout=900)


def test_every_script_is_in_the_suite():
    """A new benchmark script must be added to run_all.SUITE (and so to this smoke test)."""
    listed = {p[2] for p in run_all.SUITE} | {"run_all.py", "e2e_reward.py"}
    helpers = {"hf_torch_smollm2.py", "estimators.py"}  # run on demand; estimators.py is imported by algorithm.py
    assert {p.name for p in BENCH.glob("*.py")} - listed - helpers == set()


def test_algorithm_smoke():
    p = _smoke("algorithm")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "agreement" in p.stdout and "relax/loop" in p.stdout and "grpo+icepop" in p.stdout
    assert "M2PO band solver" in p.stdout


@pytest.mark.slow
@pytest.mark.parametrize("name", [p[0] for p in run_all.SUITE if p[0] != "algorithm"])
def test_script_smoke(name):
    if name == "e2e_trl" and not (BENCH / ".envs" / "trl" / "bin" / "python").exists():
        pytest.skip("TRL venv absent (make benchmarks/.envs/trl/bin/python)")
    p = _smoke(name)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip()
