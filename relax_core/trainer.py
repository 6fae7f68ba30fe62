"""The training loop, written once.  One step, top to bottom::

    1. rollout     a scored batch from the rollout source              (relax_core.stages.rollout)
    2. advantage   old / ref log-probs and critic values (backend no-grad forwards),
                   then the estimator's advantages and returns
    3. optimize    per optimizer step: critic step (PPO), then the actor's loss
                   (policy loss → corrections → reduce + KL − entropy, relax_core.stages.loss)
    4. publish     the new weights to the engine every --update-weights-interval steps

Synchronous local, synchronous Ray and fully-async Ray runs differ only in the objects given to
:class:`Trainer` (engine and backend or their Ray proxies; a ``SyncSource`` or ``AsyncSource`` and a
pushing or posting ``Publisher`` of :mod:`relax_core.stages.rollout`): see :func:`build_trainer`.

Old log-probs (``train/old_logp_source``): 0 = ``detach(log π_θ)`` in the loss, used when
there is exactly one optimizer step per rollout and nothing before the update needs them
(a reward-side KL, a critic and a teacher's distillation term do; the trainer's weights
*are* the old policy, so a separate forward would give the same numbers); 1 = recomputed
by a forward pass before the update; 2 = the engine's rollout log-probs
(``--use-rollout-logprobs``).
"""

from __future__ import annotations

import json
import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relax_core.batch import Batch
from relax_core.contracts import AdvantageInput
from relax_core.numerics import masked_normalize
from relax_core.reporting.metrics import MetricsLogger, non_finite, peak_rss_gib, rewrite_metrics
from relax_core.run import checkpoint as ckpt
from relax_core.run.components import Components
from relax_core.run.exits import EXIT_INTERRUPTED, EXIT_OK, EXIT_SKIPPED
from relax_core.run.interrupts import RunAborted, restore_sigint
from relax_core.stages.loss import ActorLoss, CriticLoss, LossSettings, global_denominators
from relax_core.stages.optimizer import OptimizerSettings, optimizer_step
from relax_core.stages.rollout import AsyncSource, Publisher, Rollout, SyncSource, sample_records

OLD_LOGP_CURRENT, OLD_LOGP_RECOMPUTED, OLD_LOGP_ROLLOUT = 0, 1, 2
#: per step, the dataset index, group and weight version of every sample trained
TRAINED_LOG = "trained_prompts.jsonl"


@dataclass
class LoopState:
    """What a checkpoint must restore besides weights, RNG states and the rollout side."""

    step: int = 0
    consecutive_skipped: int = 0
    skipped_steps: int = 0
    history: list[dict] = field(default_factory=list)


def old_logp_source(cfg: Any, needs_critic: bool) -> int:
    """Where ``log π_old`` comes from (see the module docstring)."""
    if cfg.use_rollout_logprobs:
        return OLD_LOGP_ROLLOUT
    if cfg.num_steps_per_rollout == 1 and cfg.kl_coef == 0 and not needs_critic and not cfg.teacher_model:
        return OLD_LOGP_CURRENT
    return OLD_LOGP_RECOMPUTED


class Trainer:
    """The loop over ``--num-rollout`` steps (see the module docstring).

    Args:
        cfg: the :class:`~relax_core.config.RunConfig`.
        comps: the run's :class:`Components`.
        source: the rollout source (``next(step)``, ``evaluate(data, step)``,
            ``cursor_state()`` and ``load_cursor(state)`` for checkpoints, ``close()``).
        publisher: the :class:`~relax_core.stages.rollout.Publisher`.
        eval_data: the evaluation dataset or ``None``.
        run_dir: the run directory (metrics, samples, checkpoints).
        behaviour_numerator: the estimator's declared behaviour numerator (given to corrections).
    """

    def __init__(self, cfg: Any, comps: Components, source: Any, publisher: Any, eval_data: Any,
                 run_dir: Path, behaviour_numerator: str | None, config_dict: dict) -> None:
        self.cfg = cfg
        self.c = comps
        self.source = source
        self.publisher = publisher
        self.eval_data = eval_data
        self.run_dir = Path(run_dir)
        self.ckpt_dir = Path(cfg.save) if cfg.save else self.run_dir / "checkpoints"
        self.config_dict = config_dict
        self.loss_settings = LossSettings.from_config(cfg, behaviour_numerator)
        self.optim_settings = OptimizerSettings.from_config(cfg, getattr(comps.estimator, "critic_settings", None))
        self.state = LoopState()
        self.old_logp_source = old_logp_source(cfg, comps.needs_critic)
        self._interrupted = False
        self.log: MetricsLogger | None = None

    # ------------------------------------------------------------------ 2. advantages

    def advantages(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """Old/ref log-probs and values, then the estimator's advantages and returns."""
        be = self.c.backend
        old = None
        if self.old_logp_source == OLD_LOGP_ROLLOUT:
            old = batch.rollout_log_probs
        elif self.old_logp_source == OLD_LOGP_RECOMPUTED:
            old = be.forward(batch, role="actor").log_probs.detach().float()
        ref = be.forward(batch, role="ref").log_probs.detach().float() if self.cfg.needs_reference_model else None
        values = be.forward(batch, role="critic").values.detach().float() if self.c.needs_critic else None
        teacher = be.forward(batch, role="teacher").log_probs.detach().float() if self.cfg.teacher_model else None
        batch = batch.replace(old_log_probs=old, ref_log_probs=ref, values=values, teacher_log_probs=teacher)
        view = AdvantageInput(**batch.items())
        out = self.c.estimator.compute_advantages(view)
        adv = out.advantages.float()  # [B, T]
        metrics = dict(out.metrics)
        for corr in self.c.advantage_terms:  # e.g. on-policy distillation: A_t − coef·(log π_old − log π_teacher)
            term = corr.advantage_term(view)
            adv = adv + term.term.float()
            metrics.update(term.metrics)
        if self.cfg.normalize_advantages and not out.normalized:  # REINFORCE++ normalises its own
            # whitening over the valid tokens of the whole batch with the sample variance
            # (× N/(N−1)), as the specification's advantage whitening
            adv, stats = masked_normalize(adv, batch.loss_mask, unbiased=True)
            metrics["rollout/advantage_raw_mean"] = stats["mean"]
        mask = batch.loss_mask
        metrics["rollout/advantage_abs_mean"] = float(adv.abs()[mask].mean()) if mask.any() else 0.0
        return batch.replace(advantages=adv, returns=out.returns.float()), metrics

    # ------------------------------------------------------------------ 3. optimizer steps

    def optimize(self, batch: Batch, step: int) -> dict[str, float]:
        """``--num-steps-per-rollout`` optimizer steps over slices of the batch (critic first
        for estimators with a critic).  Returns the step's ``train/*`` metrics."""
        be = self.c.backend
        b = batch.size
        n_steps = min(self.cfg.num_steps_per_rollout, b)
        bounds = [round(i * b / n_steps) for i in range(n_steps + 1)]
        sums: dict[str, float] = {}
        skipped = 0
        layout = getattr(be, "packed_positions", None)  # optional: (positions computed, real tokens)
        positions = filled = 0

        def add(m: dict[str, float]) -> None:
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + v / n_steps

        for lo, hi in zip(bounds[:-1], bounds[1:]):
            part = batch.slice(lo, hi)
            if layout is not None:
                computed, real = layout(part)
                positions, filled = positions + computed, filled + real
            tokens, samples = global_denominators(part.loss_mask)
            if self.c.needs_critic:
                closs = CriticLoss(self.c.estimator, self.loss_settings, num_tokens=tokens, num_samples=samples)
                cr = optimizer_step(be, part, closs, role="critic", settings=self.optim_settings)
                add({**closs.metrics(), "train/critic_grad_norm": cr.grad_norm})
            if step <= self.c.num_critic_only_steps:
                continue
            aloss = ActorLoss(self.c.estimator, self.c.corrections, self.loss_settings, num_tokens=tokens,
                              num_samples=samples, old_from_current=self.old_logp_source == OLD_LOGP_CURRENT)
            r = optimizer_step(be, part, aloss, role="actor", settings=self.optim_settings)
            m = {**aloss.metrics(), "train/grad_norm": r.grad_norm, "train/lr": r.lr}
            m.update({f"train/nonfinite/{k}": 1.0 for k in r.nonfinite})  # the offenders
            skipped += r.skipped
            add(m)
        sums["train/skipped_steps"] = float(skipped)
        sums["train/old_logp_source"] = float(self.old_logp_source)
        sums["train/global_batch_size"] = float(bounds[1] - bounds[0])
        if positions:  # the training forward's padding: positions that hold no token
            sums["perf/padding_fraction"] = 1.0 - filled / positions
        return sums

    # ------------------------------------------------------------------ one step

    def train_on(self, batch: Batch, step: int) -> dict[str, float]:
        """Stages 2 and 3 on a scored batch: advantages, then the optimizer steps."""
        if batch.size == 0:
            return {"train/skipped_steps": 0.0, "train/empty_batch": 1.0}
        batch, metrics = self.advantages(batch)
        metrics.update(self.optimize(batch, step))
        return metrics

    def step(self, step: int) -> dict[str, float]:
        t_step = time.monotonic()
        batch, metrics = self.source.next(step)  # 1
        self.publisher.before_train()
        t_train = time.monotonic()
        metrics.update(self.train_on(batch, step))  # 2 + 3
        metrics["perf/train_time"] = time.monotonic() - t_train
        if not self.cfg.load_debug_rollout_data:
            metrics.update(self.publisher.after_step(step))  # 4
            if self.c.adapter_check is not None and self.publisher.held == step:
                self.c.adapter_check(batch, step)
        metrics["perf/step_time"] = time.monotonic() - t_step
        self.log.log_samples(step, sample_records(batch, self.cfg.log_samples_per_step))
        with (self.run_dir / TRAINED_LOG).open("a") as fh:
            fh.write(json.dumps({"step": step, "prompt_index": batch.prompt_index.tolist(),
                                 "group_index": batch.group_index.tolist(),
                                 "weight_version": batch.weight_version.tolist()}) + "\n")
        return metrics

    def evaluate(self, step: int) -> dict[str, float]:
        return self.source.evaluate(self.eval_data, step)

    # ------------------------------------------------------------------ checkpoints

    def save(self, include_optimizer: bool = True) -> Path:
        """Checkpoint the current step (``--keep-checkpoints`` kept): the loop state, the
        sampler's state and the data fingerprint, the weights the engine holds; raises
        :class:`~relax_core.run.checkpoint.CheckpointError` when the write fails."""
        s = self.state
        held, weights = self.publisher.state(s.step)
        return ckpt.save_checkpoint(self.ckpt_dir, s.step, self.c.backend, {
            "step": s.step, **self.source.cursor_state(),
            "consecutive_skipped": s.consecutive_skipped, "skipped_steps": s.skipped_steps, "history": s.history,
            "engine": held}, keep=self.cfg.keep_checkpoints, include_optimizer=include_optimizer, engine_weights=weights)

    def restore(self) -> bool:
        """Load the newest checkpoint (``--resume``): weights, RNG, the sampler's state, and the
        weights the engine held; drop the metrics and trained-prompt records after it."""
        path = ckpt.latest_checkpoint(self.ckpt_dir)
        if path is None:
            return False
        ts = ckpt.load_checkpoint(path, self.c.backend)
        self.source.load_cursor(ts["cursor"], allow_other_data=self.cfg.resume_allow_data_change)
        self.state = LoopState(step=ts["step"], consecutive_skipped=ts["consecutive_skipped"],
                               skipped_steps=ts["skipped_steps"], history=ts["history"])
        rewrite_metrics(self.run_dir, self.state.history)
        self.publisher.restore(ts.get("engine", {}), ckpt.load_engine_weights(path), self.state.step)
        trained = self.run_dir / TRAINED_LOG
        if trained.is_file():  # steps after the checkpoint are trained again
            keep = [x for x in trained.read_text().splitlines() if json.loads(x)["step"] <= self.state.step]
            trained.write_text("".join(x + "\n" for x in keep))
        return True

    # ------------------------------------------------------------------ run

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self._interrupted:  # second Ctrl-C: stop now
            raise RunAborted
        self._interrupted = True
        if self.log:
            self.log.message("interrupt: finishing this step, then saving a checkpoint (Ctrl-C again to abort)")

    def run(self) -> int:
        """Train to ``--num-rollout``; returns the process exit code (0 done, 3 stopped
        after ``--max-skipped-steps`` consecutive non-finite steps, 130 interrupted)."""
        cfg = self.cfg
        resumed = cfg.resume and self.restore()
        if not resumed:
            self.publisher.share_now()
        self.log = MetricsLogger(self.run_dir, cfg, self.config_dict, start_step=self.state.step)
        if cfg.resume:
            self.log.message(f"resumed from step {self.state.step}" if resumed else "no checkpoint found; starting fresh")
        try:  # only the main thread may handle signals
            previous, installed = signal.signal(signal.SIGINT, self._on_sigint), True
        except ValueError:
            previous, installed = None, False
        try:
            if self.eval_data is not None and cfg.eval_interval and self.state.step == 0:
                self._record(0, self.evaluate(0))
            while self.state.step < cfg.num_rollout:
                step = self.state.step + 1
                metrics = self.step(step)
                if cfg.eval_interval and self.eval_data is not None and (step % cfg.eval_interval == 0 or step == cfg.num_rollout):
                    metrics.update(self.evaluate(step))
                s = self.state
                s.step = step
                skipped = int(metrics.get("train/skipped_steps", 0))
                s.skipped_steps += skipped
                s.consecutive_skipped = s.consecutive_skipped + 1 if skipped else 0
                metrics["train/skipped_steps_total"] = float(s.skipped_steps)
                self._record(step, metrics)
                if s.consecutive_skipped >= cfg.max_skipped_steps:
                    self.save()
                    self.log.message(f"stopping: {s.consecutive_skipped} consecutive steps with a non-finite loss or "
                                     f"gradient (--max-skipped-steps {cfg.max_skipped_steps}); checkpoint saved. "
                                     f"Offending metrics: {non_finite(metrics)}")
                    return EXIT_SKIPPED
                if self._interrupted:
                    path = self.save()
                    self.log.message(f"interrupted: checkpoint saved to {path}; continue with --resume")
                    return EXIT_INTERRUPTED
                if cfg.save_interval and step % cfg.save_interval == 0 and step < cfg.num_rollout:
                    self.save()
            self.save(include_optimizer=False)  # a completed run: the optimizer state is not needed
            if cfg.save_hf:
                final = ckpt.save_final_model(self.run_dir / "final", self.c.backend, self.c.engine.tokenizer,
                                              cfg.save_hf_dtype)
                self.log.message(f"final model (Hugging Face format): {final}")
        finally:
            self.source.close()
            if installed:
                restore_sigint(previous)
            self.log.close()
        return EXIT_OK

    def _record(self, step: int, metrics: dict[str, float]) -> None:
        metrics["perf/peak_rss_gib"] = peak_rss_gib()  # after the step's evaluation too
        self.state.history.append({"step": step, **{k: (v if not isinstance(v, float) or math.isfinite(v) else str(v))
                                                    for k, v in metrics.items()}})
        self.log.log(step, metrics)


def build_trainer(cfg: Any, comps: Components, train_data: Any, eval_data: Any, run_dir: Path,
                  behaviour_numerator: str | None, config_dict: dict) -> Trainer:
    """The loop for the run's mode: a pushing publisher and a :class:`SyncSource`, or with
    ``--fully-async`` a posting publisher and an :class:`AsyncSource` (the engine and the
    backend in ``comps`` are local objects or Ray proxies)."""
    weights = comps.backend.engine_adapter if comps.push_adapter else comps.backend.engine_state_dict
    publisher = Publisher(comps.engine, weights, cfg.update_weights_interval,
                          post=cfg.fully_async, share=comps.share_weights, adapter=comps.push_adapter)
    rollout = Rollout(cfg, comps, train_data, publisher)
    source = AsyncSource(rollout, cfg.max_staleness) if cfg.fully_async else SyncSource(rollout)
    return Trainer(cfg, comps, source, publisher, eval_data, run_dir, behaviour_numerator, config_dict)

