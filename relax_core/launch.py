"""``relax train``: check the data, build the run's components, run the loop.

Order matters for the user: everything that can be checked without a model (data files,
label keys, empty datasets, the reward scorer) is checked first, so a mistake costs
seconds, not a model load.  Exit codes: 0 done, 2 bad input, 3 stopped after too many
non-finite steps, 130 interrupted (checkpoint saved).
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Any

EXIT_BAD_INPUT = 2
#: exit code of a run stopped because a training worker died
EXIT_WORKER_DIED = 4


def _error(msg: str) -> int:
    print(f"relax: error: {msg}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _error_worker_died(e: Exception, ckpt_dir: Path) -> int:
    """Name the checkpoint to resume from after a training worker died."""
    from relax_core import checkpoint as ckpt

    last = ckpt.latest_checkpoint(ckpt_dir)
    where = (f"the last checkpoint is {last} (step {json.loads((last / 'trainer_state.json').read_text())['step']}); "
             "continue with the same flags and --resume" if last else
             "no checkpoint was saved (use --save-interval N to keep resumable state)")
    print(f"relax: error: {e}; {where}", file=sys.stderr, flush=True)
    return EXIT_WORKER_DIED


def find_run_dir(cfg: Any) -> Path:
    """The run directory: ``<output_dir>/<run_name>``; with ``--resume`` and no
    ``--run-name``, the newest ``<estimator>-*`` run that has a checkpoint."""
    out = Path(cfg.output_dir).expanduser()
    if cfg.run_name:
        return out / cfg.run_name
    if cfg.resume:
        runs = sorted((p for p in out.glob(f"{cfg.advantage_estimator}-*") if (p / "checkpoints" / "latest").is_file()),
                      key=lambda p: p.stat().st_mtime)
        if runs:
            return runs[-1]
    return out / f"{cfg.advantage_estimator}-{time.strftime('%Y%m%d-%H%M%S')}"


def make_score(scorer: Any, cfg: Any) -> Any:
    """``score(responses, labels, metadata, prompts) -> (rewards, metrics)`` over the run's
    scorer, run in a worker pool with timeouts (:func:`relax_core.rewarding.score_batch`; the
    prompts reach the scorers as ``metadata["prompt"]``)."""
    from relax_core import rewarding

    def score(responses: list[str], labels: list[Any], metadata: list[dict],
              prompts: list[str]) -> tuple[list[Any], dict[str, float]]:
        rewards, stats = rewarding.score_batch(scorer, responses, labels, metadata, timeout=cfg.reward_timeout,
                                               num_workers=cfg.reward_num_workers, prompts=prompts)
        return rewards, {f"rollout/{k}": float(v) for k, v in stats.items()}

    return score


def plugin_versions(reg: Any) -> dict[str, str]:
    return {p.dist: p.version for p in reg.plugins}


def launch(cfg: Any, resolved: Any, reg: Any) -> int:
    """Run ``relax train`` with a validated config; returns the exit code."""
    from relax_core.data import DataError, load_dataset

    # ---- checks that need no model
    try:
        train_data = load_dataset(cfg.data, cfg, reg)
        eval_data = load_dataset(cfg.eval_data, cfg, reg) if cfg.eval_data else None
    except DataError as e:
        return _error(str(e))
    from relax_core.rewarding import RewardSetupError, resolve_scorer

    try:
        scorer = resolve_scorer(cfg, reg)
        for ds in (train_data, eval_data):
            if ds is not None:
                scorer.check([r["metadata"] for r in ds.rows])
    except RewardSetupError as e:
        return _error(str(e))

    if cfg.use_rollout_logprobs and "rollout_log_probs" not in resolved.context.engine.caps.provides_fields:
        return _error(f"--use-rollout-logprobs needs an engine that returns log-probs; '{cfg.rollout_engine}' does not")

    import numpy as np
    import torch

    from relax_core.config import config_to_dict
    from relax_core.rewarding import build_processors
    from relax_core.metrics import git_commit
    from relax_core.trainer import Components, build_trainer

    random.seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    torch.manual_seed(cfg.seed)

    run_dir = find_run_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    config_dict = config_to_dict(cfg)
    (run_dir / "config.json").write_text(json.dumps(config_dict, indent=2, default=str))

    # ---- components
    ctx, specs = resolved.context, resolved.specs
    build = lambda key, name: specs[key].build(cfg.params_for(name), cfg)  # noqa: E731
    estimator = build("estimator", cfg.advantage_estimator)
    corrections = [build(f"correction:{c.name}", c.name) for c in ctx.corrections]
    processors = build_processors(cfg, reg)
    est_caps = ctx.estimator.caps
    corr_caps = [c.caps for c in ctx.corrections]
    top_k = max([int(getattr(c, "top_k", 0) or 0) for c in corrections] + [0])
    if any("top_k_log_probs" in c.requires_fields for c in corr_caps) and top_k == 0:
        return _error("a selected correction needs top-k log-probs but does not say how many (its object has no 'top_k')")
    routed = any("routed_experts" in c.requires_fields for c in corr_caps)
    critic_settings = getattr(estimator, "critic_settings", None) if est_caps.needs_critic else None

    runtime = None
    if cfg.launcher == "ray":  # engines and training ranks as Ray actors (relax_core.distributed)
        from relax_core.distributed.runtime import start_ray
        from relax_core.models import load_tokenizer

        runtime = start_ray(cfg, config_dict, corrections=[c.name for c in ctx.corrections],
                            tokenizer=load_tokenizer(cfg.model),
                            setup={"needs_ref": cfg.needs_reference_model, "needs_critic": est_caps.needs_critic,
                                   "needs_top_k": top_k > 0, "routing_replay": routed})
        engine, backend = runtime.engine, runtime.backend
    else:
        engine = build("engine", cfg.rollout_engine)
        backend = build("backend", cfg.train_backend)
        backend.setup(needs_ref=cfg.needs_reference_model, needs_critic=est_caps.needs_critic,
                      needs_top_k=top_k > 0, routing_replay=routed, critic_settings=critic_settings)

    comps = Components(
        engine=engine, backend=backend, estimator=estimator, corrections=corrections, processors=processors,
        score=make_score(scorer, cfg), needs_critic=est_caps.needs_critic,
        processor_resamples=any(p.caps.may_request_more_samples for p in ctx.processors),
        top_k=top_k, routed_experts=routed,
        num_critic_only_steps=critic_settings.num_critic_only_steps if critic_settings else 0)
    trainer = build_trainer(cfg, comps, train_data, eval_data, run_dir, est_caps.policy_loss_kind, config_dict)
    info = {
        "relax_core": __import__("relax_core").__version__, "plugins": plugin_versions(reg),
        "git_commit": git_commit(Path(__file__).resolve().parent), "python": sys.version.split()[0],
        "torch": torch.__version__, "old_log_probs": ["detach(current)", "recomputed", "rollout"][trainer.old_logp_source],
        "train_data": {"name": train_data.name, "rows": len(train_data), "skipped_rows": train_data.skipped},
        "eval_data": None if eval_data is None else {"name": eval_data.name, "rows": len(eval_data)},
        "command": sys.argv,
        **({"ray_startup_s": runtime.startup_s} if runtime else {}),
    }
    (run_dir / "run_info.json").write_text(json.dumps(info, indent=2, default=str))
    try:
        return trainer.run()
    except Exception as e:
        if runtime is None or not runtime.worker_died(e):
            raise
        return _error_worker_died(e, trainer.ckpt_dir)
    finally:
        shutdown = getattr(engine, "shutdown", None)
        if shutdown:
            shutdown()
        if runtime:
            runtime.shutdown()
