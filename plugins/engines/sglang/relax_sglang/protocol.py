"""SGLang's native API as Relax uses it: requests, responses, server command line.

Written from SGLang's ``GenerateReqInput`` / ``SamplingParams`` / ``server_args`` and its
HTTP entry points (``/generate``, ``/pause_generation``, ``/continue_generation``,
``/update_weights_from_disk``, ``/flush_cache``, ``/health_generate``); no SGLang import.

``/generate`` request (batch form, one sample per prompt)::

    {"input_ids": [[...], ...],
     "sampling_params": [{"temperature", "top_p", "top_k", "max_new_tokens",
                          "repetition_penalty", "stop", "sampling_seed",
                          "skip_special_tokens": false}, ...],
     "return_logprob": true, "logprob_start_len": -1, "top_logprobs_num": k,
     "return_routed_experts": bool}

Response: a list with one item per prompt::

    {"text": "...", "output_ids": [...],
     "meta_info": {"output_token_logprobs": [[logprob, token_id, null], ...],
                   "output_top_logprobs":   [[[logprob, token_id, null] × k], ...],
                   "finish_reason": {"type": "length" | "stop" | "abort", ...},
                   "routed_experts": "<base64 of int32 [P + n - 1, L, E], little-endian>",
                   "weight_version": "3", ...}}

Log-probs.  Unless ``SGLANG_RETURN_ORIGINAL_LOGPROB`` is set (the engine clears it),
SGLang returns ``log_softmax(logits / temperature)``: the tempered distribution the token
was drawn from, but *not* renormalised after top-p/top-k truncation.  So the engine
refuses ``top_p < 1`` and ``top_k > 0`` rather than return log-probs that are not those of
the sampling distribution.

Routed experts.  Row ``j`` of the payload holds the experts chosen when token ``j`` of
``prompt ++ response`` was fed (``P + n - 1`` rows: the last token is never fed).  Relax's
``routed_experts[b, t]`` is the input position that predicts response token ``t``, i.e.
row ``P - 1 + t`` (see :mod:`relax_routing_replay.routes`).
"""

from __future__ import annotations

import base64
from typing import Any, Sequence

import torch

from relax_core.batch import length_mask
from relax_core.contracts import GenerationOutput, SamplingParams


def check_sampling(s: SamplingParams) -> None:
    """Raise ``ValueError`` for settings under which SGLang's log-probs are not log q."""
    if s.top_p != 1.0 or s.top_k > 0:
        raise ValueError(f"sglang returns log-probs of the tempered distribution without top-p/top-k "
                         f"renormalisation: use --rollout-top-p 1 --rollout-top-k -1 (got top_p={s.top_p}, top_k={s.top_k})")


def generate_payload(prompt_ids: Sequence[Sequence[int]], s: SamplingParams) -> dict[str, Any]:
    """The ``/generate`` JSON body for one sample per prompt.  With ``s.seed`` set, prompt
    ``i`` gets ``sampling_seed = s.seed + i`` (a group's repeated prompts must differ).

    Raises:
        ValueError: see :func:`check_sampling`; no prompts.
    """
    check_sampling(s)
    if not prompt_ids:
        raise ValueError("generate() needs at least one prompt")

    def params(i: int) -> dict[str, Any]:
        p = {"temperature": s.temperature, "top_p": s.top_p, "top_k": -1, "max_new_tokens": s.max_new_tokens,
             "repetition_penalty": s.repetition_penalty, "skip_special_tokens": False}
        if s.stop:
            p["stop"] = list(s.stop)
        if s.seed is not None:
            p["sampling_seed"] = s.seed + i
        return p

    body: dict[str, Any] = {"input_ids": [list(map(int, p)) for p in prompt_ids],
                            "sampling_params": [params(i) for i in range(len(prompt_ids))],
                            "return_logprob": True, "logprob_start_len": -1}
    if s.return_top_k:
        body["top_logprobs_num"] = s.return_top_k
    if s.return_routed_experts:
        body["return_routed_experts"] = True
    return body


def decode_routed_experts(b64: str, *, num_layers: int, top_k: int) -> torch.Tensor:
    """``meta_info["routed_experts"]`` → long ``[rows, L, E]``.

    Raises:
        ValueError: the payload size is not a multiple of ``L × E`` int32 values.
    """
    raw = base64.b64decode(b64)
    per_row = num_layers * top_k * 4
    if len(raw) % per_row:
        raise ValueError(f"routed_experts payload of {len(raw)} bytes is not rows × {num_layers} layers × {top_k} experts × int32")
    flat = torch.frombuffer(bytearray(raw), dtype=torch.int32)
    return flat.view(-1, num_layers, top_k).long()


def decode_generate_response(items: Sequence[dict[str, Any]], prompt_lengths: Sequence[int], *, pad_id: int,
                             top_k: int = 0, routed_shape: tuple[int, int] | None = None) -> GenerationOutput:
    """Pack ``/generate`` response items (one per prompt, in order) into a :class:`GenerationOutput`.

    Args:
        items: the response list.
        prompt_lengths: ``P`` of each prompt (to slice the routed experts).
        pad_id: id written past each response.
        top_k: width of the requested top-k head (0 = none).
        routed_shape: ``(L, E)`` when routed experts were requested.

    Raises:
        ValueError: a missing field, an aborted request, a top-k head narrower than ``k``,
            or a routed-experts payload with the wrong number of rows.
    """
    b = len(items)
    metas = [it["meta_info"] for it in items]
    for m in metas:
        if "output_token_logprobs" not in m:
            raise ValueError("response has no meta_info.output_token_logprobs (was return_logprob sent?)")
        reason = m.get("finish_reason") or {}
        if isinstance(reason, dict) and reason.get("type") == "abort":
            raise ValueError(f"generation was aborted by the server: {reason}")
    lengths = [len(m["output_token_logprobs"]) for m in metas]
    t = max(lengths + [1])
    ids = torch.full((b, t), pad_id, dtype=torch.long)
    lps = torch.zeros(b, t, dtype=torch.float32)
    top_ids = torch.zeros(b, t, top_k, dtype=torch.long) if top_k else None
    top_lps = torch.full((b, t, top_k), float("-inf"), dtype=torch.float32) if top_k else None
    routed = torch.full((b, t, *routed_shape), -1, dtype=torch.long) if routed_shape else None
    for i, (m, n) in enumerate(zip(metas, lengths)):
        if n:
            ids[i, :n] = torch.tensor([int(x[1]) for x in m["output_token_logprobs"]])
            lps[i, :n] = torch.tensor([float(x[0]) for x in m["output_token_logprobs"]])
        if top_k and n:
            heads = m.get("output_top_logprobs") or []
            if len(heads) != n or any(len(h) < top_k for h in heads):
                raise ValueError(f"response top-k head is missing or narrower than k = {top_k}")
            top_ids[i, :n] = torch.tensor([[int(x[1]) for x in h[:top_k]] for h in heads])
            top_lps[i, :n] = torch.tensor([[float(x[0]) for x in h[:top_k]] for h in heads])
        if routed_shape and n:
            if "routed_experts" not in m:
                raise ValueError("response has no meta_info.routed_experts (launch with --enable-return-routed-experts)")
            rows = decode_routed_experts(m["routed_experts"], num_layers=routed_shape[0], top_k=routed_shape[1])
            p = int(prompt_lengths[i])
            if rows.shape[0] != p + n - 1:
                raise ValueError(f"routed_experts has {rows.shape[0]} rows, expected prompt {p} + response {n} - 1")
            routed[i, :n] = rows[p - 1: p - 1 + n]
    truncated = [isinstance(m.get("finish_reason"), dict) and m["finish_reason"].get("type") == "length" for m in metas]
    n_tokens = torch.tensor(lengths, dtype=torch.long)
    return GenerationOutput(
        response_ids=ids, response_lengths=n_tokens, loss_mask=length_mask(n_tokens, ids.shape[1]),
        rollout_log_probs=lps, truncated=torch.tensor(truncated, dtype=torch.bool),
        responses=[it.get("text", "") for it in items],
        top_k_ids=top_ids, top_k_log_probs=top_lps, routed_experts=routed)


def server_command(model_path: str, *, port: int, tp: int = 1, mem_fraction_static: float = 0.5, seed: int = 0,
                   context_length: int = 0, routed_experts: bool = False, python: str = "python") -> list[str]:
    """``python -m sglang.launch_server ...`` for one engine, bound to 127.0.0.1."""
    cmd = [python, "-m", "sglang.launch_server", "--model-path", model_path, "--host", "127.0.0.1",
           "--port", str(port), "--tp-size", str(tp), "--mem-fraction-static", str(mem_fraction_static),
           "--random-seed", str(seed), "--skip-server-warmup", "--log-level", "warning"]
    if context_length:
        cmd += ["--context-length", str(context_length)]
    if routed_experts:
        cmd.append("--enable-return-routed-experts")
    return cmd


def update_from_disk_payload(path: str, version: int) -> dict[str, Any]:
    """``/update_weights_from_disk`` body: load ``path`` in place, flush the radix cache,
    and tag the weights with the trainer step (echoed as ``meta_info.weight_version``)."""
    return {"model_path": path, "flush_cache": True, "weight_version": str(version)}


#: ``/pause_generation`` body used around a weight update: running requests are retracted
#: to the waiting queue (their KV cache is recomputed after ``/continue_generation``).
PAUSE_PAYLOAD = {"mode": "retract"}
