"""LoRA runs: the startup checks of the LoRA options, and the check that the adapter
reached the rollout engine.

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", arXiv
2106.09685, eq. 3) trains, for each adapted linear layer ``W`` (``d_out × d_in``, frozen),
``A`` (``r × d_in``, random) and ``B`` (``d_out × r``, zero), so that the layer computes
``h = W x + (α/r) · B A x``; at the start ``B = 0`` and the model is the base model.  The
layers are ``peft``'s (a backend declaring ``supports_lora``; the torch backend's
:mod:`relax_torch.lora`).  The engine receives the merged weights ``W + (α/r) · B A`` under
the base model's names, or, where it declares ``supports_lora_adapters``, the adapter alone
(:class:`~relax_core.contracts.AdapterWeights`); the reference model of a KL term is the same model with the adapter
disabled, i.e. the base model.  Which modules are adapted by default, per architecture, is
the backend's declaration (``BackendCapabilities.lora_default_targets``).

Nothing here imports torch at import time (it is read by startup validation).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable


def lora_problems(cfg: Any) -> list[tuple[str, str, str]]:
    """Startup problems of the LoRA options, as ``(flag, message, fix)``; every one listed.
    (What the backend can adapt is its capability rows ``supports_lora``,
    ``lora_default_targets`` and ``lora_excluded_modules``.)"""
    out = []
    if cfg.lora_rank == 0:
        defaults = {f.name: f.default for f in dataclasses.fields(type(cfg))}
        unused = [("--no-" if getattr(cfg, o) is False else "--") + o.replace("_", "-")
                  for o in ("lora_alpha", "lora_dropout", "lora_target_modules", "lora_engine_adapter", "save_hf_merged")
                  if getattr(cfg, o) != defaults[o]]
        if unused:
            out.append(("--lora-rank", f"{', '.join(unused)} set without --lora-rank: it would be a silent no-op",
                        "add --lora-rank R (e.g. 16), or drop them"))
        return out
    if cfg.lora_dropout >= 1:
        out.append(("--lora-dropout", f"--lora-dropout {cfg.lora_dropout} drops every adapter input", "use a value in [0, 1)"))
    if cfg.ref_load:
        out.append(("--ref-load", "with --lora-rank the reference model is the base model with the adapter disabled; "
                    "--ref-load would be a second model", "drop --ref-load"))
    if cfg.fully_async:
        out.append(("--fully-async", "LoRA with --fully-async is not supported yet (the check that the adapter "
                    "reached the engine runs between synchronous steps)", "drop --fully-async, or --lora-rank"))
    return out


class AdapterNotReached(RuntimeError):
    """The rollout engine's log-probs after a weight push are those of the base model, not
    those of the trainer's adapted model: the adapter did not reach the engine."""


#: Sequences and new tokens of the probe (small: it runs once per push until conclusive).
PROBE_PROMPTS, PROBE_TOKENS = 4, 16


class AdapterCheck:
    """After a weight push, is the engine's model the trainer's adapted model, or still the
    base model?

    On ``PROBE_PROMPTS`` prompts of the step's batch the engine samples up to
    ``PROBE_TOKENS`` tokens (seeded, untruncated softmax at the rollout temperature), and
    with ``e`` its log-probs of those tokens, ``a`` the trainer's (adapter on: the weights
    just pushed) and ``b`` the trainer's with the adapter disabled (the base model, which an
    engine the push missed still holds), all float32 ``[B, T]`` over the ``loss_mask``
    tokens, let ``moved = mean|a − b|``, ``d_on = mean|e − a|``, ``d_off = mean|e − b|``.

    - ``moved <= max(tol, 2 · min(d_on, d_off))``: the adapter has not yet moved the
      log-probs beyond the engine/trainer mismatch: inconclusive, checked again at the
      next push;
    - else ``d_on < d_off`` passes (then the check stops), ``d_on >= d_off`` raises.

    If the push worked, ``d_on`` is the mismatch and ``d_off ≈ moved``; if it did not,
    ``d_off`` is the mismatch and ``d_on ≈ moved``: once ``moved`` exceeds twice the
    mismatch the two cases are told apart.

    Args:
        engine: the rollout engine (``generate``).
        backend: the training backend (``forward(role="actor" | "ref")``; ``ref`` is the
            adapter-disabled model under LoRA).
        cfg: the run config (temperature, response length, seed).
        notify: called with one line when the check passes.
        tol: the smallest ``moved`` that counts, in nats per token.

    Raises (from ``__call__``):
        AdapterNotReached: the engine still computes the base model's log-probs.
    """

    def __init__(self, engine: Any, backend: Any, cfg: Any, notify: Callable[[str], None], tol: float = 1e-4):
        self.engine, self.backend, self.cfg, self.notify, self.tol = engine, backend, cfg, notify, tol
        self.passed = False

    def probe(self, batch: Any, version: int) -> tuple[float, float, float]:
        """``(moved, d_on, d_off)`` on a probe generated from ``batch``'s prompts."""
        import torch

        from relax_core.batch import Batch
        from relax_core.contracts import SamplingParams

        cfg = self.cfg
        firsts = sorted({int(g): i for i, g in reversed(list(enumerate(batch.group_index.tolist())))}.values())
        prompts = [batch.prompt_ids[i] for i in firsts[:PROBE_PROMPTS]]
        sampling = SamplingParams(temperature=cfg.rollout_temperature if cfg.rollout_temperature > 0 else 1.0,
                                  max_new_tokens=min(PROBE_TOKENS, cfg.rollout_max_response_len),
                                  seed=cfg.seed + 7919 * version)
        out = self.engine.generate(prompts, sampling)
        probe = Batch(**out.items(), prompt_ids=prompts, group_index=torch.arange(len(prompts)))
        mask = probe.loss_mask.bool()
        e = probe.rollout_log_probs.float()
        a = self.backend.forward(probe, role="actor").log_probs.float()
        b = self.backend.forward(probe, role="ref").log_probs.float()
        if not mask.any():
            return 0.0, 0.0, 0.0
        mean = lambda x: float(x.abs()[mask].mean())  # noqa: E731
        return mean(a - b), mean(e - a), mean(e - b)

    def __call__(self, batch: Any, version: int) -> None:
        """Check after the push of ``version`` (the trainer step) with ``batch``'s prompts."""
        if self.passed or batch.size == 0:
            return
        moved, d_on, d_off = self.probe(batch, version)
        if not math.isfinite(moved) or moved <= max(self.tol, 2 * min(d_on, d_off)):
            return
        if d_on >= d_off:
            raise AdapterNotReached(
                f"the LoRA adapter did not reach the rollout engine '{self.cfg.rollout_engine}': after the weight push "
                f"of step {version} its log-probs on a probe are the base model's (mean |engine − base| = {d_off:.3g}, "
                f"|engine − trainer| = {d_on:.3g} nats/token, while the adapter moved the trainer's by {moved:.3g}); "
                "the engine is not applying the weights it is given, merged or adapter (check its update_weights)")
        self.passed = True
        self.notify(f"LoRA: the engine holds the adapted weights (step {version}: mean |engine − trainer| = "
                    f"{d_on:.2g}, |engine − base| = {d_off:.2g} nats/token)")
