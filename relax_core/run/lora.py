"""LoRA runs: the default target modules, the startup checks, and the check that the
adapter reached the rollout engine.

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", arXiv
2106.09685, eq. 3) trains, for each adapted linear layer ``W`` (``d_out × d_in``, frozen),
``A`` (``r × d_in``, random) and ``B`` (``d_out × r``, zero), so that the layer computes
``h = W x + (α/r) · B A x``; at the start ``B = 0`` and the model is the base model.  The
layers are ``peft``'s (a backend declaring ``supports_lora``; the torch backend's
:mod:`relax_torch.lora`).  The engine receives the merged weights ``W + (α/r) · B A`` under
the base model's names; the reference model of a KL term is the same model with the adapter
disabled, i.e. the base model.

Nothing here imports torch at import time (it is read by startup validation).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Callable

from relax_core.config import DEFAULT_MODEL

#: Projections of the decoder's attention and MLP blocks, by Hugging Face ``model_type``.
#: Dense models: every attention and MLP projection (Hu et al. §7.1 adapt attention only;
#: QLoRA, Dettmers et al. 2023, arXiv 2305.14314 §4, finds all linear layers needed to match
#: full fine-tuning).  Mixture-of-experts models: the attention projections only (the
#: experts are fused 3-D parameters in transformers 5, not linear layers; the router is
#: left alone so routing stays the base model's).
_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
_DENSE = (*_ATTENTION, "gate_proj", "up_proj", "down_proj")
DEFAULT_TARGET_MODULES: dict[str, tuple[str, ...]] = {
    "llama": _DENSE,  # SmolLM2 (the default model)
    "qwen2": _DENSE,
    "qwen3": _DENSE,
    "qwen3_moe": _ATTENTION,
}
#: Modules a LoRA adapter may not target: the log-probs are computed from the output
#: embedding's weight directly (chunked log-softmax), and it is tied to the input embedding.
EMBEDDINGS = ("lm_head", "embed_tokens")


def model_type(model: str) -> str | None:
    """The Hugging Face ``model_type`` of ``--model`` from its ``config.json`` (no weights),
    ``"llama"`` for the default model; ``None`` when it cannot be read before loading."""
    if model == DEFAULT_MODEL:
        return "llama"
    try:
        return json.loads((Path(model).expanduser() / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None


def target_modules(cfg: Any, model_type_: str | None) -> tuple[str, ...]:
    """``--lora-target-modules``, or the default of ``model_type_``.

    Raises:
        ValueError: no modules given and no default for this architecture.
    """
    if cfg.lora_target_modules:
        return tuple(cfg.lora_target_modules)
    if model_type_ not in DEFAULT_TARGET_MODULES:
        raise ValueError(f"--lora-rank: no default --lora-target-modules for model type {model_type_!r} "
                         f"(defaults exist for {', '.join(sorted(DEFAULT_TARGET_MODULES))}); "
                         "name the linear layers to adapt, e.g. --lora-target-modules q_proj --lora-target-modules v_proj")
    return DEFAULT_TARGET_MODULES[model_type_]


def lora_problems(cfg: Any) -> list[tuple[str, str, str]]:
    """Startup problems of the LoRA options, as ``(flag, message, fix)``; every one listed.
    (Whether the backend can train adapters is the capability row ``supports_lora``.)"""
    out = []
    if cfg.lora_rank == 0:
        defaults = {f.name: f.default for f in dataclasses.fields(type(cfg))}
        unused = ["--" + o.replace("_", "-") for o in ("lora_alpha", "lora_dropout", "lora_target_modules", "save_hf_merged")
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
    if bad := sorted(set(cfg.lora_target_modules) & set(EMBEDDINGS)):
        out.append(("--lora-target-modules", f"{', '.join(bad)}: the embeddings cannot carry an adapter (the "
                    "log-probs read the output embedding's weight, which is tied to the input embedding)",
                    "target linear layers of the decoder blocks (q_proj, v_proj, ...)"))
    mt = model_type(cfg.model)
    if not cfg.lora_target_modules and mt is not None and mt not in DEFAULT_TARGET_MODULES:
        out.append(("--lora-target-modules", f"no default --lora-target-modules for model type {mt!r} (defaults "
                    f"exist for {', '.join(sorted(DEFAULT_TARGET_MODULES))})",
                    "name the linear layers to adapt, e.g. --lora-target-modules q_proj --lora-target-modules v_proj"))
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
                "the engine is not loading the merged weights it is given (check its update_weights)")
        self.passed = True
        self.notify(f"LoRA: the engine holds the adapted weights (step {version}: mean |engine − trainer| = "
                    f"{d_on:.2g}, |engine − base| = {d_off:.2g} nats/token)")
