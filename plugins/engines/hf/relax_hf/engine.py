"""The ``hf`` rollout engine: batched sampling over the KV cache of a transformers model.

One ``generate`` call left-pads the distinct prompts, runs one prefill forward on them
(logits of the last position only) and repeats each prompt's KV cache for its samples,
then runs one decode forward per new token for the rows still running (rows that finish
are dropped from the KV cache).  At each step, on the float32 logits ``z`` of
the next token:

    z' = penalty(z)                    repetition penalty ρ on every token already in the
                                       prompt or response: z/ρ where z > 0, z·ρ elsewhere
                                       (Keskar et al. 2019, CTRL §4.1; transformers' rule)
    z'' = top_p(top_k(z' / τ))         temperature τ, then top-k, then nucleus (Holtzman et
                                       al. 2020 §3.1): tokens outside are set to -inf
    y ~ q = softmax(z'')               sampled with a seeded torch.Generator (inverse CDF,
                                       :func:`sample_categorical`)
    log q(y) = log_softmax(z'')[y]     the returned ``log_probs`` (nats, float32)

τ = 0 is greedy: ``y = argmax z'`` and ``log q(y) = 0`` (the sampling distribution is a
point mass); a top-k head cannot be defined then and is refused.  The optional top-k head
(for score centering) is ``topk(log_softmax(z' / τ))``: normalised over the full
vocabulary at the sampling temperature, before top-k/top-p truncation.

A response ends at an EOS token (included in the response and its log-prob returned, so
the policy learns to stop), at a stop string (tokens up to and including the one that
completes it; the text keeps the stop string), or at ``max_new_tokens`` (``truncated``).
An EOS as the first token gives a one-token response whose text is empty.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from relax_core.batch import length_mask
from relax_core.config import resolve_device
from relax_core.contracts import GenerationOutput, SamplingParams
from relax_core.models import load_model, load_state_dict_, load_tokenizer, release_weights_, weights_released


def build(params: Any, config: Any) -> "HFEngine":
    """Factory of the ``hf`` engine: ``(HFEngineParams, RunConfig) -> HFEngine``; ``--hf-dtype
    auto`` is bfloat16 when ``config.bf16`` (decided at start-up, see
    :mod:`relax_core.run.precision`), else float32."""
    device = resolve_device(config.device)
    dtype = params.dtype if params.dtype != "auto" else "bfloat16" if config.bf16 else "float32"
    return HFEngine(config.model, dtype=dtype, device=device,
                    max_batch_size=params.max_batch_size, seed=config.seed)


def warp_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Temperature, then top-k, then top-p on next-token logits.

    Args:
        logits: float32 ``[b, V]``.
        temperature: τ > 0.
        top_k: keep the k largest (ties at the k-th value are kept); ``<= 0`` = off.
        top_p: keep the smallest most-probable set whose mass reaches ``top_p`` (the most
            probable token always stays); ``1`` = off.

    Returns:
        float32 ``[b, V]`` warped logits, ``-inf`` outside the kept set.
    """
    z = logits / temperature
    vocab = z.shape[-1]
    if 0 < top_k < vocab:
        kth = z.topk(top_k, dim=-1).values[:, -1:]  # [b, 1]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        srt, idx = z.sort(dim=-1, descending=True)  # [b, V]
        p = srt.softmax(-1)
        mass_before = p.cumsum(-1) - p  # mass of strictly earlier tokens
        srt = srt.masked_fill(mass_before >= top_p, float("-inf"))
        z = torch.empty_like(z).scatter_(-1, idx, srt)
    return z


def sample_categorical(log_probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One draw per row from ``softmax`` over the last axis, by inverse transform sampling.

    ``y = min{i : F_i > u}`` with ``F = cumsum(exp(log_probs))`` in float64 and
    ``u ~ U[0, F_V)``: one pass over the vocabulary and one uniform per row, where
    ``torch.multinomial`` draws an exponential variate per vocabulary entry (10-20x
    slower on CPU at V = 49152).  A token with probability 0 (``-inf``) is never drawn:
    ``F`` does not rise there.

    Args:
        log_probs: float ``[b, V]`` log-probabilities (normalised up to rounding; each
            row needs a finite entry).
        generator: the random stream (on the tensor's device).

    Returns:
        long ``[b]`` token ids.

    Raises:
        ValueError: a row has no finite probability mass (NaN/inf logits from the model).
    """
    cdf = torch.cumsum(log_probs.exp(), -1, dtype=torch.float64)  # [b, V]
    total = cdf[:, -1:]  # [b, 1]
    if not bool(((total > 0) & torch.isfinite(total)).all()):
        bad = (~((total > 0) & torch.isfinite(total))).squeeze(1).nonzero().squeeze(1).tolist()
        raise ValueError(f"cannot sample: rows {bad} of the next-token distribution are not finite "
                         "(NaN or inf logits from the model)")
    u = torch.rand(total.shape, generator=generator, dtype=torch.float64, device=cdf.device) * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))  # u < F_V even after rounding
    return torch.searchsorted(cdf, u, right=True).squeeze(1)


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """``z/ρ`` where ``z > 0`` and ``z·ρ`` elsewhere, at tokens with ``seen`` (bool ``[b, V]``)."""
    pen = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, pen, logits)


class HFEngine:
    """Rollout engine over a transformers causal LM (see the module docstring).

    Attributes:
        tokenizer: the model's tokenizer.
        model: the causal LM (evaluation mode).
        eos_token_ids: token ids that end a response (from the generation config and the
            tokenizer).
        weight_version: trainer step of the current weights (``-1`` = initial weights).
    """

    def __init__(self, model: str, *, dtype: str = "float32", device: str = "cpu",
                 max_batch_size: int = 64, seed: int = 0):
        self.device = torch.device(device)
        self.tokenizer = load_tokenizer(model)
        self.model = load_model(model, dtype=dtype, device=self.device)
        self.max_batch_size = max_batch_size
        eos = self.model.generation_config.eos_token_id
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        if self.tokenizer.eos_token_id is not None:
            eos.append(self.tokenizer.eos_token_id)
        self.eos_token_ids = sorted(set(eos))
        self.pad_token_id = self.tokenizer.pad_token_id
        self.weight_version = -1
        self._generator = torch.Generator(device=self.device).manual_seed(seed)

    # ------------------------------------------------------------------ weights
    def update_weights(self, state_dict: Any, version: int, *, share: bool = False) -> None:
        """Copy new weights (Hugging Face names -> tensors) into the model in place; with
        ``share=True`` replace the model's storage instead: by the given tensors themselves
        where dtype and device match (no copy), by converted copies elsewhere (see
        ``supports_shared_weights`` and :func:`relax_core.models.load_state_dict_`).

        Raises:
            KeyError / ValueError: names or shapes that do not match the model.
        """
        load_state_dict_(self.model, state_dict, share=share)
        self.weight_version = int(version)

    def release_weights(self) -> None:
        """Free the weights this engine owns (a bfloat16 copy beside a float32 trainer; none
        where a ``share=True`` push gave it the trainer's tensors) until the next
        :meth:`update_weights` (:func:`relax_core.models.release_weights_`)."""
        release_weights_(self.model)

    def shutdown(self) -> None:
        self.model = None

    # ------------------------------------------------------------------ generation
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> GenerationOutput:
        """Sample one response per prompt (repeat a prompt to get a group).

        Args:
            prompt_ids: B non-empty lists of token ids.
            sampling: the sampling settings; ``seed`` set = reproducible call, ``None`` =
                continue the engine's own random stream.

        Returns:
            :class:`~relax_core.contracts.GenerationOutput` with ``T`` = the longest
            response; ``log_probs`` float32 ``[B, T]`` (0 past each length),
            ``top_k_ids``/``top_k_log_probs`` ``[B, T, k]`` when ``return_top_k > 0``,
            ``routed_experts`` long ``[B, T, L, E]`` (-1 padding) when asked.

        Raises:
            ValueError: no prompts, an empty prompt, a top-k head with temperature 0,
                routed experts from a dense model, or invalid sampling values.
            RuntimeError: the engine was shut down, or its weights are released
                (:meth:`release_weights`) and no ``update_weights`` followed.
        """
        if self.model is None:
            raise RuntimeError("the engine was shut down")
        if weights_released(self.model):
            raise RuntimeError("the engine's weights are released (release_weights, while the trainer steps): "
                               "update_weights must come first")
        self._check(prompt_ids, sampling)
        gen = self._generator if sampling.seed is None else \
            torch.Generator(device=self.device).manual_seed(int(sampling.seed))
        chunks = [self._generate_chunk(prompt_ids[i:i + self.max_batch_size], sampling, gen)
                  for i in range(0, len(prompt_ids), self.max_batch_size)]
        t_max = max(int(c["lengths"].max()) for c in chunks)

        def cat(key: str, fill: float) -> torch.Tensor | None:
            if chunks[0][key] is None:
                return None
            parts = []
            for c in chunks:
                x = c[key][:, :t_max]
                pad = t_max - x.shape[1]
                if pad:
                    x = torch.cat([x, x.new_full((x.shape[0], pad, *x.shape[2:]), fill)], dim=1)
                parts.append(x)
            return torch.cat(parts)

        lengths = torch.cat([c["lengths"] for c in chunks])
        response_ids = cat("ids", self.pad_token_id)
        texts = self.tokenizer.batch_decode(
            [row[:n].tolist() for row, n in zip(response_ids, lengths.tolist())], skip_special_tokens=True)
        return GenerationOutput(
            response_ids=response_ids, response_lengths=lengths, loss_mask=length_mask(lengths, response_ids.shape[1]),
            rollout_log_probs=cat("log_probs", 0.0), truncated=torch.cat([c["truncated"] for c in chunks]),
            responses=texts,
            top_k_ids=cat("top_k_ids", 0), top_k_log_probs=cat("top_k_log_probs", 0.0),
            routed_experts=cat("routed_experts", -1))

    def _check(self, prompt_ids: list[list[int]], s: SamplingParams) -> None:
        if not prompt_ids:
            raise ValueError("generate() needs at least one prompt")
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("empty prompt: every prompt needs at least one token")
        if s.temperature < 0 or not 0 < s.top_p <= 1 or s.repetition_penalty <= 0 or s.max_new_tokens < 1:
            raise ValueError(f"invalid sampling settings {s}")
        if s.return_top_k and s.temperature == 0:
            raise ValueError("a top-k head needs temperature > 0 (greedy decoding has no sampling distribution)")
        if s.return_top_k > self.model.config.vocab_size:
            raise ValueError(f"return_top_k {s.return_top_k} exceeds the vocabulary {self.model.config.vocab_size}")
        if s.return_routed_experts:
            from relax_routing_replay.routes import is_moe

            if not is_moe(self.model):
                raise ValueError(f"routed experts asked from {type(self.model).__name__}, which is not a mixture-of-experts model")

    @torch.inference_mode()
    def _generate_chunk(self, prompts: list[list[int]], s: SamplingParams, gen: torch.Generator) -> dict:
        dev, b = self.device, len(prompts)
        # each distinct prompt is prefilled once (groups repeat a prompt n times), then its
        # KV cache is repeated for every sample of the prompt
        first: dict[tuple[int, ...], int] = {}
        inverse = torch.tensor([first.setdefault(tuple(p), len(first)) for p in prompts], device=dev)
        unique = list(first)
        width = max(len(p) for p in unique)
        input_ids = torch.full((len(unique), width), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros((len(unique), width), dtype=torch.long)
        for i, p in enumerate(unique):  # left-pad
            input_ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            attn[i, width - len(p):] = 1
        input_ids, attn = input_ids.to(dev), attn.to(dev)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # [u, P]
        vocab = self.model.config.vocab_size
        t_new = s.max_new_tokens
        eos = torch.tensor(self.eos_token_ids, dtype=torch.long, device=dev)

        ids = torch.full((b, t_new), self.pad_token_id, dtype=torch.long, device=dev)
        logq = torch.zeros((b, t_new), dtype=torch.float32, device=dev)
        k = s.return_top_k
        head_ids = torch.zeros((b, t_new, k), dtype=torch.long, device=dev) if k else None
        head_lp = torch.zeros((b, t_new, k), dtype=torch.float32, device=dev) if k else None
        routes = None
        seen = None
        if s.repetition_penalty != 1.0:
            seen = torch.zeros((b, vocab), dtype=torch.bool, device=dev)
            seen.scatter_(1, input_ids[inverse].clamp(0, vocab - 1), attn[inverse].bool())
        lengths = torch.zeros(b, dtype=torch.long)
        truncated = torch.zeros(b, dtype=torch.bool)
        active = torch.arange(b, device=dev)  # original rows still running

        with contextlib.ExitStack() as stack:
            recorder = None
            if s.return_routed_experts:
                from relax_routing_replay.routes import record_routes

                recorder = stack.enter_context(record_routes(self.model))
            out = self.model(input_ids=input_ids, attention_mask=attn, position_ids=pos,
                             use_cache=True, logits_to_keep=1)
            cache = out.past_key_values
            cache.batch_select_indices(inverse)
            logits = out.logits[inverse]
            attn, next_pos = attn[inverse], pos[inverse, -1] + 1  # [b, P], [b]
            for t in range(t_new):
                if recorder is not None:
                    r = recorder.routes()[:, -1].to(dev)  # [n, L, E] input position predicting token t
                    r = r[inverse] if t == 0 else r
                    recorder.reset()
                    if routes is None:
                        routes = torch.full((b, t_new, *r.shape[1:]), -1, dtype=torch.long, device=dev)
                    routes[active, t] = r
                z = logits[:, -1].float()  # [n, V]
                if seen is not None:
                    z = apply_repetition_penalty(z, seen[active], s.repetition_penalty)
                if s.temperature == 0:
                    tok = z.argmax(-1)
                    lp = torch.zeros_like(tok, dtype=torch.float32)
                else:
                    warped = warp_logits(z, s.temperature, s.top_k, s.top_p)
                    logp = warped.log_softmax(-1)
                    tok = sample_categorical(logp, gen)
                    lp = logp.gather(1, tok[:, None]).squeeze(1)
                    if k:
                        hv, hi = (z / s.temperature).log_softmax(-1).topk(k, dim=-1)
                        head_ids[active, t], head_lp[active, t] = hi, hv
                ids[active, t] = tok
                logq[active, t] = lp
                if seen is not None:
                    seen[active, tok] = True
                done = torch.isin(tok, eos)
                if s.stop:
                    done |= self._hit_stop(ids[active, :t + 1], s.stop)
                lengths[active.cpu()] = t + 1
                if t == t_new - 1:
                    truncated[active[~done].cpu()] = True
                    break
                keep = (~done).nonzero().squeeze(1)
                if keep.numel() == 0:
                    break
                if keep.numel() < active.numel():
                    cache.batch_select_indices(keep)
                    active, tok, attn, next_pos = active[keep], tok[keep], attn[keep], next_pos[keep]
                attn = torch.cat([attn, attn.new_ones((attn.shape[0], 1))], dim=1)
                logits = self.model(input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos[:, None],
                                    past_key_values=cache, use_cache=True, logits_to_keep=1).logits
                next_pos = next_pos + 1
        # clean padding past each length (the contract allows garbage; zeros read better)
        valid = torch.arange(t_new)[None, :] < lengths[:, None]  # [b, T]
        ids = torch.where(valid.to(dev), ids, self.pad_token_id).cpu()
        return {"ids": ids, "lengths": lengths, "log_probs": logq.cpu(), "truncated": truncated,
                "top_k_ids": None if head_ids is None else head_ids.cpu(),
                "top_k_log_probs": None if head_lp is None else head_lp.cpu(),
                "routed_experts": None if routes is None else routes.cpu()}

    def _hit_stop(self, generated: torch.Tensor, stop: tuple[str, ...]) -> torch.Tensor:
        """bool ``[n]``: whether each row's decoded response contains a stop string."""
        texts = self.tokenizer.batch_decode(generated.tolist(), skip_special_tokens=False)
        return torch.tensor([any(x in txt for x in stop) for txt in texts], device=generated.device)
