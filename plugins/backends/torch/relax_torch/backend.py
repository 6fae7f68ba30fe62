"""The ``torch`` training backend: plain PyTorch forward/backward/AdamW over a
transformers causal LM (actor), a frozen reference model and a critic (value head).

Sequences.  Sample ``i`` is ``[left-padded prompt_i | response_i]``: prompts are
left-padded to the micro-batch's longest prompt ``P``, responses keep their right padding,
cut at the last ``loss_mask`` column of the micro-batch.  Position ids count real tokens
only.  The hidden state at index ``P - 1 + t`` predicts response token ``t``; log-probs,
entropy, top-k log-probs and critic values are all aligned that way (``[b, T]``), and are
computed only at ``loss_mask`` positions (0 elsewhere).  By default (``--shared-prefix``)
a micro-batch is one row per prompt group instead, ``[prompt | r_1 | ... | r_n]`` with a 4-D
attention mask (Prefix Grouper), and with ``--max-tokens-per-micro-batch`` (``--packing``) its
segments are packed into one row without padding, behind a block-diagonal mask
(:mod:`relax_torch.layout`): same outputs, fewer positions.  Both are on by default where they
are exact (eager/sdpa attention, no sliding window, no routing replay); elsewhere the backend
warns and uses the plain layout.

Log-probs are taken at the rollout temperature, ``log softmax(z / τ)`` with
``τ = --rollout-temperature`` (1 when it is 0, greedy), over the full vocabulary, in float32
(float64 for float64 weights), chunked over tokens (:mod:`relax_torch.logprobs`), so that
they are comparable with the engine's ``log q``; top-p/top-k truncation is not applied
(the trainer's policy is the untruncated softmax).  Critic values use no temperature.

Optimisation.  :meth:`TorchBackend.accumulate_gradients` splits the batch into micro-batches
(``--micro-batch-size`` samples, or consecutive samples while their tokens fit
``--max-tokens-per-micro-batch``: the real tokens of the packed row with ``--packing``, prompts
of a group counted once with ``--shared-prefix``; else padded positions, ``b × (P + T)`` plain,
``G × L``, groups × longest row, with ``--shared-prefix``), sums ``loss_fn``'s micro-batch losses in
backward (they are already scaled by the global denominators) and all-reduces (sums)
gradients over data-parallel ranks when ``torch.distributed`` is initialised; the core's
optimizer step (:mod:`relax_core.stages.optimizer`: non-finite skipping, ``--clip-grad``,
``--lr-warmup-steps``) then calls :meth:`~TorchBackend.grad_norm` and
:meth:`~TorchBackend.apply_gradients`, an AdamW step (``--weight-decay``, ``--adam-beta1``,
``--adam-beta2``, ``--adam-eps``).  ``--bf16``: bfloat16 autocast
with float32 master weights and a float32 log-softmax.  Activation checkpointing
(:mod:`relax_torch.checkpointing`): selective by default (``--selective-checkpointing``: the
element-wise operations are recomputed in the backward; equal gradients in float32/float64;
not under LoRA), whole layers with ``--gradient-checkpointing``.  Dropout is disabled in every model (the old,
rollout and training forwards must be the same function), except ``--lora-dropout``.

Teacher (``--teacher-model``, on-policy distillation): a frozen model built by
:meth:`TorchBackend.setup` beside the actor, whose :meth:`~TorchBackend.forward` as role
``teacher`` gives the ``teacher_log_probs`` field, computed exactly as the actor's log-probs.

LoRA (``--lora-rank > 0``, :mod:`relax_torch.lora`): the actor carries peft's adapters and
AdamW optimises only them; the ``ref`` role is the actor with the adapter disabled (no
second model); :meth:`TorchBackend.engine_state_dict` gives the merged weights under the
base model's names; checkpoints hold the adapter and its AdamW state; :meth:`save_hf`
writes the adapter in PEFT format (and the merged model with ``--save-hf-merged``).
"""

from __future__ import annotations

import contextlib
import json
import math
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from relax_core.batch import Batch
from relax_core.config import resolve_device
from relax_core.contracts import AdapterWeights, ForwardOutput, Gradients
from relax_core.models import load_model, load_state_dict_, load_tokenizer
from relax_core.stages.optimizer import step_torch_optimizer
from relax_torch.checkpointing import checkpoint_layers
from relax_torch.layout import EXACT_ATTENTION, build_layout, group_of, layout_positions
from relax_torch.logprobs import token_log_probs
from relax_torch.lora import (
    adapter_state_dict,
    add_adapter,
    engine_adapter,
    load_adapter_state_dict_,
    merged_state_dict,
)

ROLES = ("actor", "ref", "critic", "teacher")


def build(params: Any, config: Any) -> "TorchBackend":
    """Factory of the ``torch`` backend: ``(TorchBackendParams, RunConfig) -> TorchBackend``."""
    return TorchBackend(params, config)


def _disable_dropout(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
        for attr in ("attention_dropout", "dropout", "hidden_dropout"):
            if isinstance(getattr(m, attr, None), float):
                setattr(m, attr, 0.0)


class Critic(nn.Module):
    """Value model: a causal LM's backbone and a scalar head ``V(s_t) = w·h_t + c``
    (initialised to zero, so the first values are 0)."""

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1, dtype=next(backbone.parameters()).dtype)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)


class TorchBackend:
    """See the module docstring.  Roles: ``actor`` (trained), ``ref`` (frozen, built by
    :meth:`setup`; with LoRA the actor with its adapter disabled), ``critic`` (trained,
    built by :meth:`setup`; with LoRA, too, all its weights are trained), ``teacher``
    (frozen, ``--teacher-model``, built by :meth:`setup`; a separate model, LoRA or not).

    Attributes:
        tokenizer: the model's tokenizer (pad id, ``save_hf``).
        models: role -> module (``actor``: the causal LM; ``critic``: :class:`Critic`).
        steps: role -> optimizer steps applied (:meth:`optimizer_steps`).
        checkpointing: the actor's activation checkpointing, ``"selective"``, ``"full"`` or
            None (:mod:`relax_torch.checkpointing`).
    """

    def __init__(self, params: Any, config: Any):
        self.cfg = config
        self.params = params
        self.device = torch.device(resolve_device(config.device))
        self.dtype = {"float32": torch.float32, "float64": torch.float64}[params.dtype]
        self.temperature = config.rollout_temperature if config.rollout_temperature > 0 else 1.0
        self.tokenizer = load_tokenizer(config.model)
        self.pad_token_id = self.tokenizer.pad_token_id
        self.shared_prefix = bool(getattr(params, "shared_prefix", True))
        self.packing = bool(getattr(params, "packing", True))
        actor = self._load(config.model)
        self.peft = add_adapter(actor, config) if config.lora_rank else None  # peft.PeftModel around actor
        self.checkpointing = self._enable_activation_checkpointing(actor, adapter=self.peft is not None)
        self.models: dict[str, nn.Module] = {"actor": actor}
        self.optimizers: dict[str, torch.optim.Optimizer] = {"actor": self._adamw(actor)}
        self.steps: dict[str, int] = {"actor": 0}
        self.needs_top_k = False
        self.routing_replay = False

    # ------------------------------------------------------------------ setup
    def _load(self, path: str) -> nn.Module:
        """Load a model of any role (actor, ref, teacher, critic's base): every one runs on
        the same input layout, so each is checked for it (:meth:`_inexact_layout`)."""
        m = load_model(path, dtype=self.dtype, device=self.device)
        _disable_dropout(m)
        self._check_head(m)
        self._fall_back(self._inexact_layout(m, path))
        return m

    @staticmethod
    def _check_head(model: nn.Module) -> None:
        """Refuse models whose logits are not ``lm_head(final hidden)`` (soft-capping,
        logit scaling...): the chunked log-softmax relies on it."""
        ids = torch.tensor([[1, 2, 3]], device=next(model.parameters()).device)
        with torch.no_grad():
            logits = model(input_ids=ids).logits
            h = model.base_model(input_ids=ids).last_hidden_state
            mine = model.get_output_embeddings()(h)
        if not torch.allclose(logits.float(), mine.float(), atol=1e-4, rtol=1e-4):
            raise NotImplementedError(f"{type(model).__name__}: logits are not the output embedding of the final "
                                      "hidden states (soft-capping or scaling); the torch backend cannot train it")

    @staticmethod
    def _inexact_layout(model: nn.Module, path: str = "the model") -> str | None:
        """Why the shared-prefix and packed layouts (:mod:`relax_torch.layout`) would not be
        exact for ``model`` (loaded from ``path``, named in the reason), or None."""
        impl = getattr(model.config, "_attn_implementation", None)
        if impl not in EXACT_ATTENTION:
            return (f"they need an attention implementation that takes a custom 4-D mask "
                    f"({', '.join(EXACT_ATTENTION)}); {path} uses {impl!r}")
        types = getattr(model.config, "layer_types", None) or ()
        if getattr(model.config, "use_sliding_window", False) or any("sliding" in str(t) for t in types):
            return f"{path} uses sliding-window attention, which their mask does not reproduce"
        return None

    def _fall_back(self, reason: str | None) -> None:
        """Use the plain layout (with a warning naming ``reason``) when the shared-prefix or
        packed layout is on but cannot be exact."""
        if reason is None or not (self.shared_prefix or self.packing):
            return
        on = " and ".join(f for f, v in (("--shared-prefix", self.shared_prefix), ("--packing", self.packing)) if v)
        warnings.warn(f"torch backend: {on} off ({reason}); training uses the plain padded layout "
                      "(--no-shared-prefix --no-packing silences this)", stacklevel=3)
        self.shared_prefix = self.packing = False

    def _enable_activation_checkpointing(self, model: nn.Module, *, adapter: bool) -> str | None:
        """Activation checkpointing of a trained role (:mod:`relax_torch.checkpointing`); the
        mode (``"full"``, ``"selective"`` or None).  Selective is off for a model trained
        through LoRA adapters (``adapter``): the frozen base layers' products keep nothing
        for the backward, so keeping their outputs holds about as much as it frees (measured
        on SmolLM2 at the default step: no saving)."""
        selective = bool(getattr(self.params, "selective_checkpointing", True)) and not adapter
        return checkpoint_layers(model, full=bool(self.cfg.gradient_checkpointing), selective=selective)

    def _adamw(self, model: nn.Module) -> torch.optim.Optimizer:
        """AdamW over the trainable parameters (the core sets each step's learning rate)."""
        p = self.params
        return torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=self.cfg.lr,
                                 betas=(p.adam_beta1, p.adam_beta2), eps=p.adam_eps,
                                 weight_decay=self.cfg.weight_decay)

    def setup(self, *, needs_ref: bool = False, needs_critic: bool = False, needs_top_k: bool = False,
              routing_replay: bool = False, critic_settings: Any = None) -> None:
        """Build the roles the run needs (call once, before training).

        Args:
            needs_ref: build the frozen reference model from ``--ref-load`` or, by default,
                from ``--model`` (the initial weights, whatever the actor has become); with
                LoRA, the actor itself, whose forwards as ``ref`` disable the adapter.
            needs_critic: build the critic: ``critic_settings.load`` (a model directory,
                optionally with ``value_head.safetensors``) or a copy of the initial
                backbone with a zero value head (its learning rate, ``critic_settings.lr``,
                is the core's: :class:`relax_core.stages.optimizer.OptimizerSettings`).
            needs_top_k: compute log-probs at the batch's ``top_k_ids`` in
                :meth:`accumulate_gradients`.
            routing_replay: replay the batch's ``routed_experts`` in actor and reference
                forwards (:mod:`relax_routing_replay.routes`); the shared-prefix and packed
                layouts then fall back to the plain one (with a warning).

        With ``--teacher-model`` it also builds the frozen ``teacher`` role (on-policy
        distillation), a separate model also under LoRA, whose :meth:`forward` gives the
        ``teacher_log_probs`` field (same temperature, micro-batches and float32 log-softmax
        as the actor's log-probs).
        """
        self.needs_top_k = needs_top_k
        self.routing_replay = routing_replay
        if routing_replay:
            self._fall_back("routing replay needs the routes recorded per sample at plain-layout positions")
        if needs_ref and self.peft is not None:
            self.models["ref"] = self.models["actor"]
        elif needs_ref and "ref" not in self.models:
            ref = self._load(self.cfg.ref_load or self.cfg.model)
            ref.requires_grad_(False)
            self.models["ref"] = ref
        if self.cfg.teacher_model and "teacher" not in self.models:
            teacher = self._load(self.cfg.teacher_model)
            teacher.requires_grad_(False)
            self.models["teacher"] = teacher
        if needs_critic and "critic" not in self.models:
            load = getattr(critic_settings, "load", None)
            lm = self._load(load or self.cfg.model)
            critic = Critic(lm.base_model, lm.config.hidden_size).to(self.device)
            head = Path(load) / "value_head.safetensors" if load else None
            if head is not None and head.is_file():
                from safetensors.torch import load_file

                load_state_dict_(critic.value_head, load_file(str(head)))
            self._enable_activation_checkpointing(lm, adapter=False)  # every critic weight is trained
            self.models["critic"] = critic
            self.optimizers["critic"] = self._adamw(critic)
            self.steps["critic"] = 0

    def _model(self, role: str) -> nn.Module:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; expected one of {ROLES}")
        if role not in self.models:
            raise RuntimeError(f"role {role!r} was not built: call setup(needs_{role}=True) first")
        return self.models[role]

    # ------------------------------------------------------------------ micro-batches
    def micro_batches(self, batch: Batch) -> list[tuple[int, int]]:
        """Consecutive ``[lo, hi)`` sample ranges: ``--micro-batch-size`` samples, else
        packed to ``--max-tokens-per-micro-batch`` padded tokens (at least one sample
        each), else the whole batch."""
        n = batch.size
        if self.cfg.micro_batch_size:
            m = self.cfg.micro_batch_size
            return [(i, min(n, i + m)) for i in range(0, n, m)]
        budget = self.cfg.max_tokens_per_micro_batch
        if not budget:
            return [(0, n)] if n else []
        t_last = _last_column(batch.loss_mask)  # [B] response columns needed
        if self.shared_prefix or self.packing:
            return self._segment_micro_batches(batch, t_last, budget)
        out, lo, p_max, t_max = [], 0, 0, 0
        for i in range(n):
            p, t = max(p_max, len(batch.prompt_ids[i])), max(t_max, int(t_last[i]))
            if i > lo and (i - lo + 1) * (p + t) > budget:
                out.append((lo, i))
                lo, p, t = i, len(batch.prompt_ids[i]), int(t_last[i])
            p_max, t_max = p, t
        out.append((lo, n))
        return out

    def _segment_micro_batches(self, batch: Batch, t_last: Tensor, budget: int) -> list[tuple[int, int]]:
        """``--max-tokens-per-micro-batch`` for the layouts of :mod:`relax_torch.layout`:
        consecutive samples while the layout's positions fit: its real tokens when packed
        (``Σ len_s``, one row without padding), else ``S × L`` (segments × longest).  A group
        cut by a boundary repeats its prompt in each part (exact, less sharing)."""
        n = batch.size
        inv, _ = group_of(batch.group_index if self.shared_prefix else None, n)
        plen = [len(x) for x in batch.prompt_ids]
        t = t_last.tolist()
        out, lo = [], 0
        segs: dict[int, int] = {}  # segment -> length in the current micro-batch
        longest = total = 0
        for i in range(n):  # one pass over samples (as the plain packing), O(1) each
            g = int(inv[i])
            length = segs.get(g, plen[i]) + t[i]
            grown = total + length - segs.get(g, 0)
            cost = grown if self.packing else (len(segs) + (g not in segs)) * max(longest, length)
            if i > lo and cost > budget:
                out.append((lo, i))
                lo, segs, longest, total = i, {}, 0, 0
                length = grown = plen[i] + t[i]
            segs[g] = length
            longest, total = max(longest, length), grown
        out.append((lo, n))
        return out

    def _packs(self) -> bool:
        """Micro-batches are packed rows (``--packing`` with ``--max-tokens-per-micro-batch``)."""
        return self.packing and bool(self.cfg.max_tokens_per_micro_batch) and not self.cfg.micro_batch_size

    def packed_positions(self, batch: Batch) -> tuple[int, int]:
        """(positions the forward computes for ``batch`` in its micro-batches, padding
        included; those holding a token): ``Σ b × (P + T')`` and ``Σ (P_i + T'_i)`` plain,
        ``Σ R × L`` and ``Σ len_s`` in the layouts of :mod:`relax_torch.layout`.  The padding
        fraction is ``1 − tokens / positions``."""
        t_last = _last_column(batch.loss_mask)
        plen = torch.tensor([len(x) for x in batch.prompt_ids], dtype=torch.long)
        positions = tokens = 0
        for lo, hi in self.micro_batches(batch):
            if self.shared_prefix or self._packs():
                gi = None if batch.group_index is None or not self.shared_prefix else batch.group_index[lo:hi]
                a, r = layout_positions(plen[lo:hi], t_last[lo:hi], group_of(gi, hi - lo)[0], pack=self._packs())
            else:
                a = (hi - lo) * int(plen[lo:hi].max() + t_last[lo:hi].max())
                r = int((plen[lo:hi] + t_last[lo:hi]).sum())
            positions, tokens = positions + a, tokens + r
        return positions, tokens

    # ------------------------------------------------------------------ forward
    def _inputs(self, mb: Batch) -> tuple:
        """(input_ids, attention_mask, position_ids, P, T', layout) of ``[prompt | response[:, :T']]``
        (``layout`` None), or with ``--shared-prefix``/``--packing`` of the segment rows
        (:class:`~relax_torch.layout.Layout`; ``P`` None)."""
        if self.shared_prefix or self._packs():
            model = self.models["actor"]
            lay = build_layout(mb.prompt_ids, mb.group_index, mb.response_ids, mb.loss_mask, self.pad_token_id,
                               model.config.vocab_size, share=self.shared_prefix, pack=self._packs(),
                               sdpa=model.config._attn_implementation == "sdpa", mask_dtype=self.dtype)
            return (lay.input_ids.to(self.device), lay.attention_mask.to(self.device),
                    lay.position_ids.to(self.device), None, lay.t_eff, lay)
        mask = mb.loss_mask.bool()
        t_eff = int(_last_column(mask).max()) if mask.numel() else 0
        resp = mb.response_ids[:, :t_eff].long()
        vocab = self.models["actor"].config.vocab_size
        in_range = (resp >= 0) & (resp < vocab)
        if not in_range[mask[:, :t_eff]].all():
            raise ValueError(f"response token ids outside the vocabulary [0, {vocab}) at loss_mask positions")
        resp = torch.where(in_range, resp, self.pad_token_id)
        b, p = mb.size, max((len(x) for x in mb.prompt_ids), default=0)
        if any(len(x) == 0 for x in mb.prompt_ids):
            raise ValueError("empty prompt: every sample needs at least one prompt token")
        ids = torch.full((b, p + t_eff), self.pad_token_id, dtype=torch.long)
        attn = torch.ones((b, p + t_eff), dtype=torch.long)
        for i, x in enumerate(mb.prompt_ids):
            ids[i, p - len(x): p] = torch.as_tensor(x, dtype=torch.long)
            attn[i, : p - len(x)] = 0
        ids[:, p:] = resp
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        return ids.to(self.device), attn.to(self.device), pos.to(self.device), p, t_eff, None

    def _replay(self, role: str, mb: Batch, p: int, t_eff: int):
        """Routing-replay context for an actor/ref forward of ``mb`` (or a null context)."""
        routed = mb.routed_experts
        if not (self.routing_replay and role in ("actor", "ref") and routed is not None):
            return contextlib.nullcontext()
        from relax_routing_replay.routes import replay_routes

        positions = (p - 1 + torch.arange(t_eff))[None, :].expand(mb.size, t_eff)
        return replay_routes(self.models[role], routed[:, :t_eff].to(self.device), positions.to(self.device))

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bool(self.cfg.bf16))

    def _forward_mb(self, mb: Batch, inputs: tuple, role: str, entropy: bool, top_k: bool) -> ForwardOutput:
        """Forward of one micro-batch (``inputs`` from :meth:`_inputs`); grad follows the
        caller's grad mode.  Runs inside :meth:`_replay` of the same micro-batch."""
        model = self._model(role)
        ids, attn, pos, p, t_eff, lay = inputs
        b, t = mb.response_ids.shape
        backbone = model.backbone if role == "critic" else model.base_model
        with self._autocast():
            hidden = backbone(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).last_hidden_state
        sel = mb.loss_mask[:, :t_eff].bool().to(self.device)  # [b, T']
        if lay is None:
            rows = hidden[:, p - 1: p - 1 + t_eff][sel]  # [N, H]; index P - 1 + t predicts response token t
            targets = ids[:, p:][sel]  # [N]
        else:  # the prompt's last hidden state predicts every response's first token (gradients add up)
            s_cpu = sel.cpu()
            rows = hidden[lay.src_row[s_cpu].to(self.device), lay.src_col[s_cpu].to(self.device)]  # [N, H]
            targets = lay.targets[s_cpu].to(self.device)  # [N]

        def scatter(x: Tensor) -> Tensor:  # [N, ...] -> [b, T, ...] with zeros off-mask
            full = x.new_zeros((b, t, *x.shape[1:]))
            return full.index_put(sel.nonzero(as_tuple=True), x)

        if role == "critic":
            v = model.value_head(rows.to(model.value_head.weight.dtype)).squeeze(-1).float()
            return ForwardOutput(log_probs=None, values=scatter(v))
        head = model.get_output_embeddings()
        top_ids = None
        if top_k:
            if mb.top_k_ids is None:
                raise KeyError("top-k log-probs asked but the batch has no top_k_ids")
            top_ids = mb.top_k_ids[:, :t_eff].to(self.device)[sel].long()
        lp, ent, top = token_log_probs(rows, head.weight, targets, bias=head.bias, temperature=self.temperature,
                                       top_ids=top_ids, entropy=entropy, chunk=self.params.logits_chunk_size)
        return ForwardOutput(log_probs=scatter(lp), entropy=None if ent is None else scatter(ent),
                             top_k_log_probs=None if top is None else scatter(top))

    def forward(self, batch: Batch, *, role: str = "actor", entropy: bool = False,
                top_k: bool = False) -> ForwardOutput:
        """No-grad forward of a whole batch (old, reference or teacher log-probs, values).

        Returns:
            :class:`~relax_core.contracts.ForwardOutput` with ``[B, T]`` float32 tensors
            (``log_probs``, ``entropy`` if asked, ``top_k_log_probs`` ``[B, T, k]`` if asked,
            ``values`` for the critic, whose ``log_probs`` is ``None``); 0 off ``loss_mask``.

        Raises:
            ValueError: unknown role; RuntimeError: role not built by :meth:`setup`.
        """
        model = self._model(role)
        model.eval()
        outs = []
        base = self.peft.disable_adapter() if role == "ref" and self.peft is not None else contextlib.nullcontext()
        with torch.no_grad(), base:
            for lo, hi in self.micro_batches(batch):
                mb = batch.slice(lo, hi)
                inputs = self._inputs(mb)
                with self._replay(role, mb, *inputs[3:5]):
                    outs.append(self._forward_mb(mb, inputs, role, entropy, top_k))

        def cat(name: str) -> Tensor | None:
            xs = [getattr(o, name) for o in outs]
            return None if not xs or xs[0] is None else torch.cat(xs).cpu()

        if not outs:
            z = torch.zeros(tuple(batch.response_ids.shape))
            return ForwardOutput(log_probs=None if role == "critic" else z, values=z if role == "critic" else None)
        return ForwardOutput(log_probs=cat("log_probs"), entropy=cat("entropy"),
                             top_k_log_probs=cat("top_k_log_probs"), values=cat("values"))

    # ------------------------------------------------------------------ training
    def _optimizer(self, role: str) -> torch.optim.Optimizer:
        if role not in ("actor", "critic"):
            raise ValueError(f"train role must be 'actor' or 'critic', got {role!r}")
        self._model(role)  # raises the right error for a role not built
        return self.optimizers[role]

    def accumulate_gradients(self, batch: Batch, loss_fn: Any, *, role: str = "actor") -> Gradients:
        """Forward and backward of every micro-batch of ``batch`` into cleared gradients,
        all-reduced (summed) over data-parallel ranks; no optimizer step.

        ``loss_fn(micro_batch, forward_output) -> (loss, metrics)``: ``loss`` is a scalar
        already divided by the global denominators, so backward simply sums the
        micro-batches.  Optional attributes of ``loss_fn``: ``needs_entropy`` (default
        ``True``) and ``needs_top_k`` (default: ``setup(needs_top_k=...)``).  A micro-batch
        with a non-finite loss is not backpropagated.  Under data parallelism every rank
        runs the same number of micro-batches, the largest of the ranks' (token packing can
        give ranks different counts, and a loss with a collective per micro-batch, such as
        m2po's ``--m2po-stat-scope global``, would wait forever), by splitting its largest
        micro-batches (:func:`split_to_count`); a rank with fewer samples than that count
        (uneven shares, e.g. a filter that under-filled the batch) runs one per sample, so
        only such a collective loss can still be left waiting there.

        Returns:
            :class:`~relax_core.contracts.Gradients`: the loss and metrics summed over
            micro-batches, the non-finite names (on any rank: ``other_rank``), the count.

        Raises:
            ValueError: ``role`` is not ``actor`` or ``critic``; RuntimeError: not built.
        """
        self._optimizer(role).zero_grad(set_to_none=True)
        model = self._model(role)
        entropy = bool(getattr(loss_fn, "needs_entropy", True)) and role == "actor"
        top_k = bool(getattr(loss_fn, "needs_top_k", self.needs_top_k)) and role == "actor"
        bounds = self.micro_batches(batch)
        dist = torch.distributed
        data_parallel = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        if data_parallel:
            count = torch.tensor([len(bounds)], device=self.device)
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
            bounds = split_to_count(bounds, int(count.item()))
        sums: dict[str, float] = {"loss": 0.0}
        bad: set[str] = set()
        model.train()
        try:
            for lo, hi in bounds:
                mb = batch.slice(lo, hi)
                inputs = self._inputs(mb)
                with self._replay(role, mb, *inputs[3:5]):  # open through backward (recomputation replays too)
                    out = self._forward_mb(mb, inputs, role, entropy, top_k)
                    loss, metrics = loss_fn(mb.to(self.device), out)  # the loss sees one device
                    value = float(loss.detach())
                    sums["loss"] += value
                    for k, v in metrics.items():
                        if k != "loss":
                            sums[k] = sums.get(k, 0.0) + float(v)
                        if not math.isfinite(float(v)):
                            bad.add(k)
                    if not math.isfinite(value):
                        bad.add("loss")
                    elif loss.requires_grad:  # (a loss_fn may return a constant for an all-masked micro-batch)
                        loss.backward()
        finally:
            model.eval()
        params = [q for q in model.parameters() if q.requires_grad]
        for q in params:
            if q.grad is None:
                q.grad = torch.zeros_like(q)
        if data_parallel:
            for q in params:
                dist.all_reduce(q.grad)  # sum: the losses carry global denominators
            flag = torch.tensor([float(bool(bad))], device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() and not bad:
                bad.add("other_rank")
        return Gradients(sums=sums, nonfinite=frozenset(bad), micro_batches=len(bounds))

    def grad_norm(self, role: str = "actor") -> float:
        """Global L2 norm of ``role``'s gradients (equal on every rank after the all-reduce)."""
        grads = [q.grad for g in self._optimizer(role).param_groups for q in g["params"]]
        return float(torch.nn.utils.get_total_norm(grads, norm_type=2.0))

    def apply_gradients(self, role: str = "actor", *, lr: float, grad_scale: float = 1.0) -> None:
        """Scale the gradients by ``grad_scale`` (the core's clip), then one AdamW step of
        ``role`` at learning rate ``lr``."""
        step_torch_optimizer(self._optimizer(role), lr=lr, grad_scale=grad_scale)
        self.steps[role] += 1

    def zero_grad(self, role: str = "actor") -> None:
        """Release ``role``'s gradients."""
        self._optimizer(role).zero_grad(set_to_none=True)

    def optimizer_steps(self, role: str = "actor") -> int:
        """AdamW steps applied to ``role`` (restored by :meth:`load_checkpoint`)."""
        self._optimizer(role)
        return self.steps[role]

    # ------------------------------------------------------------------ weights and checkpoints
    def engine_state_dict(self) -> dict[str, Tensor]:
        """The actor's weights with Hugging Face names (detached views of the live
        parameters: copy them before the next optimizer step if you keep them); with LoRA
        the merged weights under the base model's names (:func:`relax_torch.lora.merged_state_dict`)."""
        if self.peft is not None:
            return merged_state_dict(self.models["actor"])
        return {k: v.detach() for k, v in self.models["actor"].state_dict().items()}

    def engine_adapter(self) -> AdapterWeights:
        """LoRA runs: the actor's adapter in PEFT format (:func:`relax_torch.lora.engine_adapter`).

        Raises:
            RuntimeError: not a LoRA run."""
        if self.peft is None:
            raise RuntimeError("engine_adapter() needs a LoRA run (--lora-rank > 0)")
        return engine_adapter(self.peft)

    def save_checkpoint(self, path: str, include_optimizer: bool = True) -> None:
        """Write ``path/`` with, per trained role, ``<role>.safetensors`` (weights),
        ``<role>_optim.safetensors`` (AdamW moments and step counts; not with
        ``include_optimizer=False``) and ``backend_state.json`` (optimizer
        hyper-parameters, step counts).  With LoRA ``actor.safetensors`` holds the adapter
        only (the base weights are ``--model``'s)."""
        from safetensors.torch import save_file, save_model

        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        state: dict[str, Any] = {"format": 1, "steps": self.steps, "param_groups": {}}
        for role, opt in self.optimizers.items():
            if role == "actor" and self.peft is not None:
                save_file(adapter_state_dict(self.models[role]), str(out / f"{role}.safetensors"))
            else:
                save_model(self.models[role], str(out / f"{role}.safetensors"))
            if not include_optimizer:
                continue
            sd = opt.state_dict()
            tensors = {f"{i}.{k}": v.contiguous() for i, st in sd["state"].items() for k, v in st.items()
                       if isinstance(v, Tensor)}
            save_file(tensors, str(out / f"{role}_optim.safetensors"))
            state["param_groups"][role] = sd["param_groups"]
        (out / "backend_state.json").write_text(json.dumps(state, indent=1))

    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote (weights, optimizer, step counts);
        a checkpoint saved without optimizer state leaves AdamW fresh.

        Raises:
            FileNotFoundError: missing files; KeyError/ValueError: a checkpoint of another
                model or of other roles.
        """
        from safetensors.torch import load_file, load_model

        src = Path(path)
        state = json.loads((src / "backend_state.json").read_text())
        if set(state["steps"]) != set(self.optimizers):
            raise KeyError(f"checkpoint roles {sorted(state['steps'])} != this run's trained roles {sorted(self.optimizers)}")
        for role, opt in self.optimizers.items():
            if role == "actor" and self.peft is not None:
                load_adapter_state_dict_(self.models[role], load_file(str(src / f"{role}.safetensors"), device=str(self.device)))
            else:
                load_model(self.models[role], str(src / f"{role}.safetensors"), device=str(self.device))
            self.steps[role] = int(state["steps"][role])
            if role not in state["param_groups"]:  # saved without optimizer state
                continue
            flat = load_file(str(src / f"{role}_optim.safetensors"), device=str(self.device))
            per: dict[int, dict[str, Tensor]] = {}
            for key, v in flat.items():
                i, name = key.split(".", 1)
                per.setdefault(int(i), {})[name] = v
            opt.load_state_dict({"state": per, "param_groups": state["param_groups"][role]})

    def save_hf(self, path: str) -> None:
        """Save the actor as a Hugging Face directory (loadable by
        ``AutoModelForCausalLM.from_pretrained``), with the tokenizer; the critic, if
        any, goes to ``path/critic`` (backbone + ``value_head.safetensors``).

        With LoRA ``path`` holds the adapter in PEFT format (``adapter_config.json``,
        ``adapter_model.safetensors``: ``peft.PeftModel.from_pretrained(base, path)``, or
        ``AutoModelForCausalLM.from_pretrained(path)`` with peft installed), and with
        ``--save-hf-merged`` ``path/merged`` the merged model (the weights the engine gets)."""
        from safetensors.torch import save_file

        if self.peft is not None:
            self.peft.save_pretrained(path)
            if self.cfg.save_hf_merged:
                merged = load_model(self.cfg.model, dtype=self.dtype)
                load_state_dict_(merged, merged_state_dict(self.models["actor"]))
                merged.save_pretrained(Path(path) / "merged")
                self.tokenizer.save_pretrained(Path(path) / "merged")
        else:
            self.models["actor"].save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        if "critic" in self.models:
            critic = self.models["critic"]
            critic.backbone.save_pretrained(Path(path) / "critic")
            save_file({k: v.contiguous() for k, v in critic.value_head.state_dict().items()},
                      str(Path(path) / "critic" / "value_head.safetensors"))


def split_to_count(bounds: list[tuple[int, int]], count: int) -> list[tuple[int, int]]:
    """Split the largest ``[lo, hi)`` sample ranges in half until there are ``count`` of them,
    or every range holds one sample (a rank with fewer samples than ``count``: uneven
    data-parallel shares); order kept, ranges only get smaller."""
    out = list(bounds)
    while len(out) < count:
        i = max(range(len(out)), key=lambda j: out[j][1] - out[j][0], default=None)
        if i is None or out[i][1] - out[i][0] < 2:
            break
        lo, hi = out[i]
        mid = (lo + hi + 1) // 2
        out[i:i + 1] = [(lo, mid), (mid, hi)]
    return out


def _last_column(mask: Tensor) -> Tensor:
    """long ``[B]``: 1 + index of the last True of each row of ``mask`` (0 if none)."""
    t = mask.shape[1]
    idx = torch.arange(1, t + 1, device=mask.device)
    return (mask.bool() * idx).amax(1) if t else torch.zeros(mask.shape[0], dtype=torch.long)
