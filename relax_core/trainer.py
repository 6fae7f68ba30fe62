"""The synchronous training loop.  One step, top to bottom::

    1. rollout     rollout_batch_size prompts × n_samples_per_prompt samples  (engine)
    2. reward      scorer per sample, then the post-processors in order         (rewarding)
    3. advantage   old / ref log-probs and critic values, then the estimator    (backend, estimator)
    4. loss+step   per optimizer step: policy loss → corrections → reduce →
                   + KL loss − entropy bonus; critic step for PPO               (loss.py, backend)
       then the new weights go to the engine.

Everything the loop calls is a plain object built from a plugin spec (see
:mod:`relax_core.launch`).  Shapes: ``B`` samples, ``T`` padded response length.

Old log-probs (``train/old_logp_source``): 0 = ``detach(log π_θ)`` in the loss, used when
there is exactly one optimizer step per rollout and nothing before the update needs them
(the trainer's weights *are* the old policy, so a separate forward would give the same
numbers); 1 = recomputed by a forward pass before the update; 2 = the engine's rollout
log-probs (``--use-rollout-logprobs``).
"""

from __future__ import annotations

import json
import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from relax_core import checkpoint as ckpt
from relax_core.contracts import AdvantageInput, RewardBatch, RolloutBatch, SamplingParams, TrainBatch
from relax_core.data import DataCursor, Dataset, encode_prompts
from relax_core.interrupts import RunAborted
from relax_core.loss import ActorLoss, CriticLoss, LossSettings, global_denominators
from relax_core.metrics import MetricsLogger, rewrite_metrics
from relax_core.rewarding import apply_processors, mean_over_rounds
from relax_core.numerics import ZERO_STD_TOL, group_stats, masked_normalize

OLD_LOGP_CURRENT, OLD_LOGP_RECOMPUTED, OLD_LOGP_ROLLOUT = 0, 1, 2
EXIT_OK, EXIT_SKIPPED, EXIT_INTERRUPTED = 0, 3, 130
#: A sample counts as correct for pass@1 when its reward is at least this.
CORRECT_REWARD = 1.0 - 1e-6


@dataclass
class Components:
    """The objects of one run, built from the selected specs."""

    engine: Any
    backend: Any
    estimator: Any
    corrections: list[Any]
    processors: list[Any]
    score: Callable[[list[str], list[Any], list[dict], list[str]], tuple[list[float | None], dict[str, float]]]
    """``score(responses, labels, metadata, prompts) -> (one reward or None per sample, metrics)``;
    the four lists have one entry per sample (``prompts``: the prompt texts as the engine saw them)."""
    needs_critic: bool = False
    processor_resamples: bool = False
    top_k: int = 0
    routed_experts: bool = False
    num_critic_only_steps: int = 0


@dataclass
class LoopState:
    """What a checkpoint must restore besides weights and RNG states."""

    step: int = 0
    consecutive_skipped: int = 0
    skipped_steps: int = 0
    history: list[dict] = field(default_factory=list)


def sampling_seed(seed: int, step: int, round_: int = 0) -> int:
    """Per-step generation seed, so a resumed run samples exactly what the original did."""
    return (seed * 1_000_003 + step * 101 + round_) % (2**31 - 1)


# --------------------------------------------------------------------------- batch helpers


def _pad_to(x: torch.Tensor, t: int, value: float) -> torch.Tensor:
    if x.shape[1] == t:
        return x
    pad = torch.full((x.shape[0], t - x.shape[1], *x.shape[2:]), value, dtype=x.dtype)
    return torch.cat([x, pad], dim=1)


def select(batch: RolloutBatch, idx: list[int]) -> RolloutBatch:
    """The samples ``idx`` of a batch (tensors and python lists alike)."""
    ix = torch.as_tensor(idx, dtype=torch.long)
    out = {}
    for name in ("response_ids", "loss_mask", "response_lengths", "rollout_log_probs", "rewards", "group_index",
                 "prompt_index", "weight_version", "truncated", "top_k_ids", "top_k_log_probs", "routed_experts"):
        v = getattr(batch, name)
        out[name] = None if v is None else v[ix]
    for name in ("prompt_ids", "prompts", "responses", "labels", "metadata"):
        v = getattr(batch, name)
        out[name] = [v[i] for i in idx] if v else v
    return batch.replace(**out)


def concat(batches: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """Concatenate batches along samples, right-padding token fields to the widest."""
    if len(batches) == 1:
        return batches[0]
    t = max(b.response_ids.shape[1] for b in batches)
    pads = {"response_ids": pad_id, "loss_mask": False, "rollout_log_probs": 0.0, "top_k_ids": 0,
            "top_k_log_probs": 0.0, "routed_experts": -1}
    out: dict[str, Any] = {}
    for name in ("response_ids", "loss_mask", "response_lengths", "rollout_log_probs", "rewards", "group_index",
                 "prompt_index", "weight_version", "truncated", "top_k_ids", "top_k_log_probs", "routed_experts"):
        vals = [getattr(b, name) for b in batches]
        if vals[0] is None:
            out[name] = None
            continue
        if name in pads:
            vals = [_pad_to(v, t, pads[name]) for v in vals]
        out[name] = torch.cat(vals)
    for name in ("prompt_ids", "prompts", "responses", "labels", "metadata"):
        out[name] = [x for b in batches for x in getattr(b, name)]
    return batches[0].replace(**out)


def staleness_metrics(weight_version: torch.Tensor, step: int) -> dict[str, float]:
    """``staleness/mean`` and ``staleness/max`` of the samples trained at ``step``.

    ``weight_version``: long ``[B]``, the step whose weights generated each sample (0 = the
    initial weights).  The staleness of a sample trained at step ``k`` is
    ``(k - 1) - weight_version`` steps: 0 when it was generated by the weights the trainer
    held before step ``k`` (on-policy); up to ``--update-weights-interval - 1`` in the
    synchronous loop, up to ``--max-staleness`` with ``--fully-async``.
    """
    if weight_version.numel() == 0:
        return {"staleness/mean": 0.0, "staleness/max": 0.0}
    s = (step - 1 - weight_version).float()
    return {"staleness/mean": float(s.mean()), "staleness/max": float(s.max())}


def rollout_metrics(batch: RolloutBatch, generated: list[RolloutBatch]) -> dict[str, float]:
    """``rollout/*`` metrics of a step: rewards, lengths and truncation over every generated
    sample (``generated``: the scored batches before any filter); the share of no-signal
    groups over the batch that is trained on (``batch``)."""
    raw = torch.cat([g.rewards for g in generated])
    lengths = torch.cat([g.response_lengths for g in generated]).float()
    finite = torch.isfinite(raw)
    out = {
        "rollout/raw_reward": float(raw[finite].mean()) if finite.any() else math.nan,
        "rollout/response_len/mean": float(lengths.mean()),
        "rollout/response_len/max": float(lengths.max()),
        "rollout/truncated_ratio": float(torch.cat([g.truncated for g in generated]).float().mean()),
        "rollout/num_samples": float(batch.size),
    }
    if batch.size:
        st = group_stats(batch.rewards, batch.group_index)
        no_signal = (st["group_count"] < 2) | (st["group_std"] <= ZERO_STD_TOL)
        kept = torch.isfinite(batch.rewards)
        out["rollout/reward"] = float(batch.rewards[kept].mean()) if kept.any() else math.nan
        out["rollout/zero_std_group_frac"] = float(no_signal.float().mean())
    return out


# --------------------------------------------------------------------------- debug replay


def save_rollout(directory: Path, step: int, batch: RolloutBatch) -> None:
    """Write a scored rollout batch as ``step_N.safetensors`` + ``step_N.json``."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: getattr(batch, k).contiguous() for k in (
        "response_ids", "loss_mask", "response_lengths", "rollout_log_probs", "rewards", "group_index",
        "prompt_index", "weight_version", "truncated", "top_k_ids", "top_k_log_probs", "routed_experts")
        if getattr(batch, k) is not None}
    save_file(tensors, str(directory / f"step_{step:06d}.safetensors"))
    py = {k: getattr(batch, k) for k in ("prompt_ids", "prompts", "responses", "labels", "metadata")}
    (directory / f"step_{step:06d}.json").write_text(json.dumps(py, default=str))


def load_rollout(directory: Path, step: int) -> RolloutBatch:
    """Read the batch :func:`save_rollout` wrote for ``step``.

    Raises:
        FileNotFoundError: no stored batch for that step.
    """
    from safetensors.torch import load_file

    base = Path(directory) / f"step_{step:06d}"
    if not base.with_suffix(".safetensors").is_file():
        raise FileNotFoundError(f"--load-debug-rollout-data: no stored rollout for step {step} in {directory}")
    t = load_file(str(base.with_suffix(".safetensors")))
    py = json.loads(base.with_suffix(".json").read_text())
    opt = {k: t.get(k) for k in ("rollout_log_probs", "top_k_ids", "top_k_log_probs", "routed_experts")}
    return RolloutBatch(response_ids=t["response_ids"], loss_mask=t["loss_mask"], response_lengths=t["response_lengths"],
                        rewards=t["rewards"], group_index=t["group_index"], prompt_index=t["prompt_index"],
                        weight_version=t["weight_version"], truncated=t["truncated"], **opt, **py)


# --------------------------------------------------------------------------- the loop


class Trainer:
    """The loop over ``--num-rollout`` steps (see the module docstring).

    Args:
        cfg: the :class:`~relax_core.config.RunConfig`.
        comps: the run's :class:`Components`.
        train_data / eval_data: validated datasets.
        run_dir: the run directory (metrics, samples, checkpoints).
        policy_loss_kind: the estimator's declared kind (given to corrections).
    """

    def __init__(self, cfg: Any, comps: Components, train_data: Dataset, eval_data: Dataset | None,
                 run_dir: Path, policy_loss_kind: str, config_dict: dict) -> None:
        self.cfg = cfg
        self.c = comps
        self.data = train_data
        self.eval_data = eval_data
        self.run_dir = Path(run_dir)
        self.ckpt_dir = Path(cfg.save) if cfg.save else self.run_dir / "checkpoints"
        self.config_dict = config_dict
        self.loss_settings = LossSettings.from_config(cfg, policy_loss_kind)
        self.cursor = DataCursor(len(train_data), cfg.seed)
        self.state = LoopState()
        self.engine_version = 0  # the step whose weights the engine holds (pushed every --update-weights-interval steps)
        self.tokenizer = comps.engine.tokenizer
        self._prompt_cache: dict[int, tuple[str, list[int]]] = {}
        self._interrupted = False
        if cfg.use_rollout_logprobs:
            self.old_logp_source = OLD_LOGP_ROLLOUT
        elif cfg.num_steps_per_rollout == 1 and cfg.kl_coef == 0 and not comps.needs_critic:
            self.old_logp_source = OLD_LOGP_CURRENT
        else:
            self.old_logp_source = OLD_LOGP_RECOMPUTED
        self.log: MetricsLogger | None = None

    # ------------------------------------------------------------------ 1. rollout

    def _prompts(self, indices: list[int]) -> tuple[list[str], list[list[int]]]:
        todo = [i for i in indices if i not in self._prompt_cache]
        if todo:
            texts, ids = encode_prompts([self.data.rows[i]["prompt"] for i in todo], self.tokenizer, self.cfg)
            self._prompt_cache.update(zip(todo, zip(texts, ids)))
        return [self._prompt_cache[i][0] for i in indices], [self._prompt_cache[i][1] for i in indices]

    def sampling(self, seed: int, max_new_tokens: int | None = None) -> SamplingParams:
        cfg = self.cfg
        return SamplingParams(temperature=cfg.rollout_temperature, top_p=cfg.rollout_top_p, top_k=cfg.rollout_top_k,
                              max_new_tokens=max_new_tokens or cfg.rollout_max_response_len,
                              repetition_penalty=cfg.rollout_repetition_penalty, stop=tuple(cfg.rollout_stop),
                              seed=seed, return_top_k=self.c.top_k, return_routed_experts=self.c.routed_experts)

    def generate(self, rows: list[dict], indices: list[int], n: int, sampling: SamplingParams,
                 group_offset: int, version: int) -> RolloutBatch:
        """Generate ``n`` samples for each prompt (rewards NaN until :meth:`score`)."""
        texts, ids = self._prompts(indices) if rows is self.data.rows else encode_prompts(
            [rows[i]["prompt"] for i in indices], self.tokenizer, self.cfg)
        rep = [j for j in range(len(indices)) for _ in range(n)]
        out = self.c.engine.generate([ids[j] for j in rep], sampling)
        lengths = out.response_lengths.long()  # [B]
        t = out.response_ids.shape[1]
        loss_mask = torch.arange(t)[None, :] < lengths[:, None]  # [B, T]
        b = len(rep)
        batch = RolloutBatch(
            prompt_ids=[ids[j] for j in rep], response_ids=out.response_ids.long(), loss_mask=loss_mask,
            response_lengths=lengths, rollout_log_probs=None if out.log_probs is None else out.log_probs.float(),
            rewards=torch.full((b,), math.nan), group_index=torch.as_tensor([group_offset + j for j in rep]),
            prompt_index=torch.as_tensor([indices[j] for j in rep]), weight_version=torch.full((b,), version),
            truncated=out.truncated.bool(), top_k_ids=out.top_k_ids, top_k_log_probs=out.top_k_log_probs,
            routed_experts=out.routed_experts, prompts=[texts[j] for j in rep], responses=list(out.texts),
            labels=[rows[indices[j]]["label"] for j in rep], metadata=[rows[indices[j]]["metadata"] for j in rep])
        return batch

    def score(self, batch: RolloutBatch) -> tuple[RolloutBatch, dict[str, float]]:
        """Raw rewards from the scorer (NaN = unscored) and its error counts."""
        rewards, metrics = self.c.score(batch.responses, batch.labels, batch.metadata, batch.prompts)
        return batch.replace(rewards=torch.tensor([math.nan if r is None else float(r) for r in rewards])), metrics

    # ------------------------------------------------------------------ 2. reward post-processing

    def post_process(self, batch: RolloutBatch) -> tuple[RolloutBatch, dict[str, float]]:
        """Run the post-processors in order; drop the samples they do not keep."""
        rb = RewardBatch(rewards=batch.rewards.clone(), group_index=batch.group_index,
                         response_lengths=batch.response_lengths, truncated=batch.truncated,
                         responses=batch.responses, keep=torch.ones(batch.size, dtype=torch.bool))
        rb = apply_processors(self.c.processors, rb)
        batch = batch.replace(rewards=rb.rewards.float())
        if not bool(rb.keep.all()):
            batch = select(batch, torch.nonzero(rb.keep).flatten().tolist())
        return batch, {f"rollout/{k}" if "/" not in k else k: v for k, v in rb.metrics.items()}

    def rollout(self, step: int) -> tuple[RolloutBatch, dict[str, float]]:
        """Stages 1-2: sample and score ``rollout_batch_size`` groups (more rounds when a
        post-processor drops groups and may ask for more)."""
        cfg = self.cfg
        rounds = 1 + (cfg.max_oversampling_rounds if self.c.processor_resamples else 0)
        kept: list[RolloutBatch] = []
        generated: list[RolloutBatch] = []
        metrics: dict[str, float] = {"rollout/reward_errors": 0.0, "rollout/reward_timeouts": 0.0}
        n_groups, gen_tokens, t_gen = 0, 0, 0.0
        proc_rounds: list[dict[str, float]] = []
        for r in range(rounds):
            t0 = time.monotonic()
            if cfg.load_debug_rollout_data:
                batch = load_rollout(Path(cfg.load_debug_rollout_data), step)
            else:
                indices = self.cursor.take(cfg.rollout_batch_size)
                batch = self.generate(self.data.rows, indices, cfg.n_samples_per_prompt,
                                      self.sampling(sampling_seed(cfg.seed, step, r)),
                                      group_offset=(step * rounds + r) * cfg.rollout_batch_size, version=self.engine_version)
            t_gen += time.monotonic() - t0
            gen_tokens += int(batch.response_lengths.sum())
            if not cfg.load_debug_rollout_data:
                t0 = time.monotonic()
                batch, score_metrics = self.score(batch)
                metrics["perf/reward_time"] = metrics.get("perf/reward_time", 0.0) + time.monotonic() - t0
                for k, v in score_metrics.items():
                    metrics[k] = metrics.get(k, 0.0) + v
            if cfg.save_debug_rollout_data and r == 0:
                save_rollout(Path(cfg.save_debug_rollout_data), step, batch)
            generated.append(batch)
            batch, proc_metrics = self.post_process(batch)
            proc_rounds.append(proc_metrics)
            kept.append(batch)
            n_groups += int(torch.unique(batch.group_index).numel()) if batch.size else 0
            if n_groups >= cfg.rollout_batch_size or cfg.load_debug_rollout_data:
                break
        metrics.update(mean_over_rounds(proc_rounds))  # the whole step, not its last round
        batch = concat([b for b in kept if b.size] or kept[:1], self.tokenizer.pad_token_id or 0)
        if n_groups > cfg.rollout_batch_size:  # keep the first rollout_batch_size groups
            first = set(torch.unique(batch.group_index).tolist()[: cfg.rollout_batch_size])
            batch = select(batch, [i for i, g in enumerate(batch.group_index.tolist()) if g in first])
        metrics.update(rollout_metrics(batch, generated))
        metrics.update(staleness_metrics(batch.weight_version, step))
        metrics["perf/rollout_time"] = t_gen
        metrics["perf/rollout_tokens_per_s"] = gen_tokens / max(t_gen, 1e-9)
        return batch, metrics

    # ------------------------------------------------------------------ 3. advantages

    def advantages(self, batch: RolloutBatch) -> tuple[TrainBatch, dict[str, float]]:
        """Old/ref log-probs and values, then the estimator's advantages and returns."""
        cfg, be = self.cfg, self.c.backend
        tensors: dict[str, torch.Tensor] = {}
        for name in ("rollout_log_probs", "top_k_ids", "top_k_log_probs", "routed_experts"):
            if getattr(batch, name) is not None:
                tensors[name] = getattr(batch, name)
        tb = TrainBatch(prompt_ids=batch.prompt_ids, response_ids=batch.response_ids, loss_mask=batch.loss_mask,
                        tensors=tensors)
        old = None
        if self.old_logp_source == OLD_LOGP_ROLLOUT:
            old = batch.rollout_log_probs
        elif self.old_logp_source == OLD_LOGP_RECOMPUTED:
            old = be.forward(tb, role="actor").log_probs.detach().float()
        ref = be.forward(tb, role="ref").log_probs.detach().float() if cfg.needs_reference_model else None
        values = be.forward(tb, role="critic").values.detach().float() if self.c.needs_critic else None
        out = self.c.estimator.compute_advantages(AdvantageInput(
            rewards=batch.rewards, group_index=batch.group_index, loss_mask=batch.loss_mask, old_log_probs=old,
            ref_log_probs=ref, values=values, response_lengths=batch.response_lengths))
        adv = out.advantages.float()  # [B, T]
        metrics = dict(out.metrics)
        if cfg.normalize_advantages and not out.normalized:  # REINFORCE++ normalises its own
            adv, stats = masked_normalize(adv, batch.loss_mask)
            metrics["rollout/advantage_raw_mean"] = stats["mean"]
        mask = batch.loss_mask
        metrics["rollout/advantage_abs_mean"] = float(adv.abs()[mask].mean()) if mask.any() else 0.0
        extra = {"advantages": adv, "returns": out.returns.float()}
        if old is not None:
            extra["old_log_probs"] = old
        if ref is not None:
            extra["ref_log_probs"] = ref
        if values is not None:
            extra["values"] = values
        return TrainBatch(prompt_ids=tb.prompt_ids, response_ids=tb.response_ids, loss_mask=tb.loss_mask,
                          tensors={**tensors, **extra}), metrics

    # ------------------------------------------------------------------ 4. loss and optimizer steps

    def optimize(self, tb: TrainBatch, step: int) -> dict[str, float]:
        """``--num-steps-per-rollout`` optimizer steps over slices of the batch (critic first
        for estimators with a critic).  Returns the step's ``train/*`` metrics."""
        cfg, be = self.cfg, self.c.backend
        b = tb.size
        n_steps = min(cfg.num_steps_per_rollout, b)
        bounds = [round(i * b / n_steps) for i in range(n_steps + 1)]
        sums: dict[str, float] = {}
        skipped = 0

        def add(m: dict[str, float]) -> None:
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + v / n_steps

        for lo, hi in zip(bounds[:-1], bounds[1:]):
            part = _slice(tb, lo, hi)
            tokens, samples = global_denominators(part.loss_mask)
            if self.c.needs_critic:
                closs = CriticLoss(self.c.estimator, self.loss_settings, num_tokens=tokens, num_samples=samples)
                cm = be.train_step(part, closs, role="critic")
                add({**closs.metrics(), "train/critic_grad_norm": float(cm.get("grad_norm", math.nan))})
            if step <= self.c.num_critic_only_steps:
                continue
            aloss = ActorLoss(self.c.estimator, self.c.corrections, self.loss_settings, num_tokens=tokens,
                              num_samples=samples, old_from_current=self.old_logp_source == OLD_LOGP_CURRENT)
            bm = be.train_step(part, aloss, role="actor")
            m = aloss.metrics()
            m["train/grad_norm"] = float(bm.get("grad_norm", math.nan))
            if "lr" in bm:
                m["train/lr"] = float(bm["lr"])
            m.update({f"train/{k}": v for k, v in bm.items() if k.startswith("nonfinite/")})  # the offenders
            if bm.get("skipped") or not math.isfinite(m.get("train/loss", math.nan)) or not math.isfinite(m["train/grad_norm"]):
                skipped += 1
            add(m)
        sums["train/skipped_steps"] = float(skipped)
        sums["train/old_logp_source"] = float(self.old_logp_source)
        sums["train/global_batch_size"] = float(bounds[1] - bounds[0])
        return sums

    # ------------------------------------------------------------------ one step

    def step(self, step: int) -> dict[str, float]:
        t_step = time.monotonic()
        batch, metrics = self.rollout(step)  # 1 + 2
        samples = self._samples(batch)
        t_train = time.monotonic()
        if batch.size == 0:
            metrics["train/skipped_steps"] = 0.0
            metrics["train/empty_batch"] = 1.0
        else:
            tb, adv_metrics = self.advantages(batch)  # 3
            metrics.update(adv_metrics)
            metrics.update(self.optimize(tb, step))  # 4
        metrics["perf/train_time"] = time.monotonic() - t_train
        if step % self.cfg.update_weights_interval == 0 and not self.cfg.load_debug_rollout_data:
            t0 = time.monotonic()
            self.c.engine.update_weights(self.c.backend.engine_state_dict(), step)
            self.engine_version = step
            metrics["perf/update_weights_time"] = time.monotonic() - t0
        metrics["perf/step_time"] = time.monotonic() - t_step
        self.log.log_samples(step, samples)
        return metrics

    def _samples(self, batch: RolloutBatch) -> list[dict]:
        k = min(self.cfg.log_samples_per_step, batch.size)
        if k == 0:
            return []
        stride = max(1, batch.size // k)
        return [{"prompt": batch.prompts[i], "response": batch.responses[i], "reward": float(batch.rewards[i]),
                 "label": batch.labels[i], "response_len": int(batch.response_lengths[i]),
                 "truncated": bool(batch.truncated[i])} for i in range(0, batch.size, stride)[:k]]

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, step: int) -> dict[str, float]:
        """``eval/<name>/reward_mean`` and ``eval/<name>/pass@1`` on the first
        ``--eval-max-prompts`` evaluation prompts, ``--n-samples-per-eval-prompt`` each,
        with a fixed seed (comparable across steps)."""
        ds = self.eval_data
        idx = list(range(min(len(ds), self.cfg.eval_max_prompts)))
        n = self.cfg.n_samples_per_eval_prompt
        t0 = time.monotonic()
        batch = self.generate(ds.rows, idx, n, self.sampling(sampling_seed(self.cfg.seed, 0, 999)), 0, step)
        r = self.score(batch)[0].rewards
        name = f"eval/{ds.name}"
        return {f"{name}/reward_mean": float(torch.nan_to_num(r, nan=0.0).mean()),
                f"{name}/pass@1": float((r >= CORRECT_REWARD).float().mean()),
                f"{name}/response_len/mean": float(batch.response_lengths.float().mean()),
                "perf/eval_time": time.monotonic() - t0}

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_state(self) -> dict:
        """The JSON-able loop state a checkpoint stores (``trainer_state.json``)."""
        s = self.state
        return {"step": s.step, "cursor": self.cursor.state(), "data": self.data.fingerprint,
                "consecutive_skipped": s.consecutive_skipped, "skipped_steps": s.skipped_steps, "history": s.history}

    def save(self, include_optimizer: bool = True) -> Path:
        """Checkpoint the current step (``--keep-checkpoints`` kept); raises
        :class:`~relax_core.checkpoint.CheckpointError` when the write fails."""
        return ckpt.save_checkpoint(self.ckpt_dir, self.state.step, self.c.backend, self.checkpoint_state(),
                                    keep=self.cfg.keep_checkpoints, include_optimizer=include_optimizer)

    def restore(self) -> bool:
        """Load the newest complete checkpoint (``--resume``); push its weights to the engine."""
        path = ckpt.latest_checkpoint(self.ckpt_dir)
        if path is None:
            return False
        ts = ckpt.load_checkpoint(path, self.c.backend)
        self.cursor.load(ts["cursor"], allow_other_data=self.cfg.resume_allow_data_change)
        self.state = LoopState(step=ts["step"], consecutive_skipped=ts["consecutive_skipped"],
                               skipped_steps=ts["skipped_steps"], history=ts["history"])
        rewrite_metrics(self.run_dir, self.state.history)
        self.c.engine.update_weights(self.c.backend.engine_state_dict(), self.state.step)
        self.engine_version = self.state.step
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
        self.log = MetricsLogger(self.run_dir, cfg, self.config_dict, start_step=self.state.step)
        if cfg.resume:
            self.log.message(f"resumed from step {self.state.step}" if resumed else "no checkpoint found; starting fresh")
        try:  # only the main thread may handle signals
            previous = signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:
            previous = None
        code = EXIT_OK
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
                                     f"Offending metrics: {_non_finite(metrics)}")
                    return EXIT_SKIPPED
                if self._interrupted:
                    path = self.save()
                    self.log.message(f"interrupted: checkpoint saved to {path}; continue with --resume")
                    return EXIT_INTERRUPTED
                if cfg.save_interval and step % cfg.save_interval == 0 and step < cfg.num_rollout:
                    self.save()
            self.save(include_optimizer=False)  # a completed run: the optimizer state is not needed
            if cfg.save_hf:
                final = self.run_dir / "final"
                self.c.backend.save_hf(str(final))
                self.tokenizer.save_pretrained(str(final))
                if cfg.save_hf_dtype == "bfloat16":
                    ckpt.convert_hf_dtype(final, torch.bfloat16)
                self.log.message(f"final model (Hugging Face format): {final}")
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
            self.log.close()
        return code

    def _record(self, step: int, metrics: dict[str, float]) -> None:
        self.state.history.append({"step": step, **{k: (v if not isinstance(v, float) or math.isfinite(v) else str(v))
                                                    for k, v in metrics.items()}})
        self.log.log(step, metrics)


def _slice(tb: TrainBatch, lo: int, hi: int) -> TrainBatch:
    if lo == 0 and hi == tb.size:
        return tb
    return TrainBatch(prompt_ids=tb.prompt_ids[lo:hi], response_ids=tb.response_ids[lo:hi],
                      loss_mask=tb.loss_mask[lo:hi], tensors={k: v[lo:hi] for k, v in tb.tensors.items()})


def _non_finite(metrics: dict[str, float]) -> str:
    bad = {k: v for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)}
    return ", ".join(f"{k}={v}" for k, v in sorted(bad.items())) or "(none reported)"
