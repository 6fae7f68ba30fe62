"""Faults on a local Ray: a rollout engine actor killed mid-run is restarted and its prompts
re-issued (every prompt of every step trained exactly once, with the current weights); a
training rank killed mid-run stops the run with exit code 4 and a resumable checkpoint."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

import relax_core.distributed.runtime as runtime_mod
from relax_core.data import DataCursor
from relax_core.distributed.proxies import RayEngine
from relax_core.reporting.metrics import read_metrics
from relax_core.run.exits import EXIT_WORKER_DIED
from relax_ray_helpers import ray_args, run_train, trained


def expected_prompts(steps: int, per_step: int, rows: int = 8, seed: int = 3) -> list[list[int]]:
    cursor = DataCursor(rows, seed)
    return [cursor.take(per_step) for _ in range(steps)]


def check_exactly_once(log: list[dict], steps: int, n: int = 4) -> None:
    assert [r["step"] for r in log] == list(range(1, steps + 1))
    for r, want in zip(log, expected_prompts(steps, 2)):
        assert Counter(r["prompt_index"]) == {p: n for p in want}, r
        assert set(Counter(r["group_index"]).values()) == {n}, r


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_killed_engine_is_restarted_and_every_prompt_trained_once(mode, tiny_model_dir, prompts_file, tmp_path,
                                                                   ray_local, monkeypatch):
    calls = {"n": 0}
    original = RayEngine.generate

    def generate(self, prompt_ids, sampling):  # kill the engine while the 3rd request is in flight
        calls["n"] += 1
        if calls["n"] == 3:
            threading.Timer(0.05, ray_local.kill, (self.actors[0],), {"no_restart": False}).start()
        return original(self, prompt_ids, sampling)

    monkeypatch.setattr(RayEngine, "generate", generate)
    extra = ("--fully-async", "--max-staleness", "1") if mode == "async" else ()
    code, out = run_train(ray_args(tiny_model_dir, prompts_file, tmp_path, "kill", *extra))
    assert code == 0, out
    run = tmp_path / "kill"
    recs = read_metrics(run)
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    assert recs[-1]["rollout/engine_restarts"] >= 1  # a request was re-issued
    log = trained(run)
    check_exactly_once(log, 4)
    # the restarted engine got the current weights: staleness stays within its bound
    stale = {r["step"] - 1 - v for r in log for v in r["weight_version"]}
    assert stale == {0} if mode == "sync" else stale <= {0, 1}


@pytest.mark.slow
def test_killed_training_rank_stops_with_a_resumable_checkpoint(tiny_model_dir, prompts_file, tmp_path,
                                                                 ray_local, monkeypatch):
    started = []
    original = runtime_mod.start_ray
    monkeypatch.setattr(runtime_mod, "start_ray", lambda *a, **k: started.append(original(*a, **k)) or started[-1])
    run = tmp_path / "die"

    def killer():
        while not (run / "checkpoints" / "step_000002").is_dir():
            time.sleep(0.05)
        ray_local.kill(started[0].workers[0], no_restart=True)

    threading.Thread(target=killer, daemon=True).start()
    args = ray_args(tiny_model_dir, prompts_file, tmp_path, "die", "--save-interval", "1")
    code, out = run_train(args)
    assert code == EXIT_WORKER_DIED, out
    assert "training worker rank 0 of 1 died" in out and "--resume" in out
    done = len(read_metrics(run))
    assert 2 <= done < 4

    monkeypatch.setattr(runtime_mod, "start_ray", original)
    code, out = run_train([*args, "--resume"])
    assert code == 0, out
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4]
    check_exactly_once(trained(run), 4)
