"""The external example `examples/relax-dapo`, installed from its own directory into a temp
dir (not the shared environment): its own tests pass, it is listed by `relax plugins` and
in the capability matrix, a dry run validates it, and it trains 2 steps on a tiny model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from relax_core.reporting.metrics import read_metrics

DAPO = Path(__file__).resolve().parents[2] / "examples" / "relax-dapo"

SCORER = '''
def vowel_fraction(response, label, metadata):
    """Varies between samples even for a random model, so advantages are not all zero."""
    letters = [c for c in response.lower() if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0
'''


@pytest.fixture(scope="module")
def site(make_site):
    s = make_site("dapo-site")
    s.install(DAPO)
    return s


@pytest.mark.slow  # the contract kit's 2-rank check starts worker processes
def test_its_own_tests_pass(site):
    res = site.run("-m", "pytest", "-q", "tests", cwd=DAPO)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "skipped" not in res.stdout


def test_listed_and_in_the_capability_matrix(site):
    plugins = {p["name"]: p for p in json.loads(site.relax("plugins", "--json").stdout)["plugins"]}
    assert plugins["dapo"]["status"] == "ok" and plugins["dapo"]["distribution"] == "relax-dapo"
    assert plugins["dapo"]["path"].startswith(str(site.path))
    caps = json.loads(site.relax("capabilities", "--json").stdout)["estimator"]["components"]["dapo"]
    assert caps["requires_per_token_loss"] is True and caps["behaviour_numerator"] == "old_log_probs"


def test_dry_run(site):
    res = site.relax("train", "--dry-run", "--advantage-estimator", "dapo", "--calculate-per-token-loss",
                     "--reward-processor", "overlong_penalty", "--dapo-clip-high", "0.3")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["components"]["estimator"] == {"name": "dapo", "origin": "relax-dapo 0.1.0"}
    assert out["config"]["plugin_params"]["dapo"] == {"clip_low": 0.2, "clip_high": 0.3}


@pytest.mark.slow
def test_trains_two_steps_on_a_tiny_model(site, tiny_model_dir, tmp_path):
    (tmp_path / "ext_scorers.py").write_text(SCORER)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + {i + 1}?", "label": str(2 * i + 1)}) + "\n"
                            for i in range(8)))
    site.env["PYTHONPATH"] += f":{tmp_path}"
    res = site.relax(
        "train", "--advantage-estimator", "dapo", "--calculate-per-token-loss", "--dapo-clip-high", "0.28",
        "--reward-processor", "overlong_penalty", "--custom-rm-path", "ext_scorers:vowel_fraction",
        "--model", str(tiny_model_dir), "--data", str(data), "--output-dir", str(tmp_path), "--run-name", "run",
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--global-batch-size", "8",
        "--rollout-max-response-len", "8", "--num-rollout", "2", "--lr", "1e-3", "--seed", "3",
        "--reward-num-workers", "1", "--quiet", "--no-save-hf", cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = tmp_path / "run"
    assert json.loads((run / "config.json").read_text())["advantage_estimator"] == "dapo"
    assert "relax-dapo" in json.loads((run / "run_info.json").read_text())["plugins"]
    recs = read_metrics(run)
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        assert math.isfinite(r["train/loss"]) and math.isfinite(r["train/grad_norm"]), r
        assert r["train/skipped_steps"] == 0.0 and r["rollout/num_samples"] == 8.0
        assert 0.0 <= r["train/pg_clipfrac"] <= 1.0
