"""A reward model under `--launcher ray` runs in a Ray actor of its own: the same scores as
the driver's reward workers, a dead actor's samples counted and the actor replaced, a GPU
the cluster lacks refused at start-up, and a Ray training run scoring through it."""

from __future__ import annotations

import os

import pytest

from relax_core.config import RunConfig
from relax_core.reporting.metrics import read_metrics
from relax_core.stages.rewarding import RewardSetupError, Scorer, score_batch
from relax_ray_helpers import run_train

pytest.importorskip("relax_reward_model")
from relax_reward_model.plugin import RewardModelParams, relax_register_reward_scorers  # noqa: E402
from relax_reward_model.testing import tiny_reward_model  # noqa: E402

SPEC = relax_register_reward_scorers()[0]
RESPONSES = ["4", "The answer is 4.", "five", ""]
PROMPTS = ["What is 2 + 2?"] * 3 + [""]  # the last sample has no text at all: unscored (None)


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    return tiny_reward_model(tmp_path_factory.mktemp("rm"))


def _scorer(rm_dir, device="cpu"):
    cfg = RunConfig(plugin_params={"reward_model": RewardModelParams(path=rm_dir, device=device)})
    return Scorer({"reward_model": SPEC}, reward="reward_model", config=cfg)


def _score(scorer, pool=None):
    return score_batch(scorer, RESPONSES, [None] * 4, [{}] * 4, timeout=60, num_workers=1, prompts=PROMPTS, pool=pool)


def test_scores_in_its_own_actor_equal_the_drivers_and_a_dead_actor_is_replaced(ray_local, rm_dir):
    import ray

    from relax_core.distributed.scoring import ActorScoringPool, actor_gpus

    scorer = _scorer(rm_dir)
    assert actor_gpus(scorer) == 0.0 and actor_gpus(_scorer(rm_dir, "cuda")) == 1.0
    assert actor_gpus(Scorer({"reward_model": SPEC}, reward="auto", config=scorer.config)) is None  # per-sample choice
    local, stats = _score(scorer)
    assert stats["reward_errors"] == 0 and local[3] is None and all(isinstance(r, float) for r in local[:3])
    pool = ActorScoringPool(scorer, 1, 0.0)
    try:
        assert pool.pid != os.getpid()
        assert _score(scorer, pool) == (local, stats)  # the same model, the same floats
        ray.kill(pool.actor, no_restart=True)
        rewards, failed = _score(scorer, pool)
        assert rewards == [None] * 4 and failed == {"reward_errors": 4, "reward_timeouts": 0}  # counted, never 0
        assert pool.restarts == 1
        assert _score(scorer, pool) == (local, stats)  # the replacement scores again
    finally:
        pool.close()
    assert pool.closed


def test_a_gpu_the_cluster_lacks_is_refused(ray_local, rm_dir):
    from relax_core.distributed.scoring import ActorScoringPool

    if ray_local.cluster_resources().get("GPU", 0) >= 1:
        pytest.skip("this cluster has a GPU")
    with pytest.raises(RewardSetupError, match=r"'reward_model' needs 1 GPU\(s\) for its Ray actor and the cluster "
                                               r"has 0; use --reward-model-device cpu"):
        ActorScoringPool(_scorer(rm_dir, "cuda"), 1, 1.0)


@pytest.mark.slow
def test_a_ray_run_scores_through_the_reward_models_actor(tiny_model_dir, prompts_file, tmp_path, ray_local, rm_dir,
                                                          monkeypatch):
    from relax_core.distributed import scoring

    calls, pools = [], []
    original = scoring.ActorScoringPool.score

    def counted(self, responses, *rest):
        calls.append(len(responses))
        pools.append(self)
        return original(self, responses, *rest)

    monkeypatch.setattr(scoring.ActorScoringPool, "score", counted)
    code, out = run_train([
        "--model", str(tiny_model_dir), "--data", str(prompts_file), "--output-dir", str(tmp_path), "--run-name", "rm",
        "--launcher", "ray", "--reward", "reward_model", "--reward-model-path", rm_dir, "--rollout-batch-size", "2",
        "--n-samples-per-prompt", "4", "--global-batch-size", "8", "--rollout-max-response-len", "8",
        "--num-rollout", "2", "--quiet", "--seed", "3", "--reward-num-workers", "1", "--no-save-hf",
        "--eval-data", "none"])
    assert code == 0, out
    recs = read_metrics(tmp_path / "rm")
    assert [r["step"] for r in recs] == [1, 2]
    assert all(r["rollout/reward_errors"] == 0 for r in recs)
    assert calls.count(8) >= 2  # every step's 8 samples were scored by the actor
    assert len(set(map(id, pools))) == 1 and pools[0].closed and pools[0].restarts == 0  # one actor, stopped at the end
