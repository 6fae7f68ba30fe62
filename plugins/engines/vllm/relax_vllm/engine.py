"""The vLLM rollout engine (:class:`relax_core.contracts.RolloutEngine`).

One in-process ``vllm.LLM`` per engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: no engine-core
subprocess, so it also lives inside a Ray actor as is).

Log-probs.  vLLM's default ``logprobs_mode="raw_logprobs"`` returns log-softmax of the
model's *raw* logits, before temperature, top-k and top-p.  The contract asks for log q of
the *sampling* distribution, so the engine is built with ``logprobs_mode=
"processed_logprobs"``: log-softmax of the logits after temperature and top-k/top-p masking
(masked tokens −inf), i.e. exactly the distribution the token was drawn from.  The top-k
head comes from the same processed distribution, so it is asked only with top-p = 1 and
top-k off, where it is the full-vocabulary softmax at the sampling temperature (the
contract's head).  Temperature 0 is greedy: the sampling distribution is a point mass, so
``log q = 0`` (as the hf engine returns) and a top-k head is refused.

Stop strings end a response after the token that completes them, and the text keeps the
stop string (``include_stop_str_in_output``), as in the hf engine.

Weight updates write the Hugging Face state dict to a safetensors file in a private
directory and call the worker's ``reload_weights(weights_path=dir)`` through
``collective_rpc`` (a method name, so no callable is pickled), then reset the prefix cache.

LoRA runs (``--lora-rank``, unless ``--no-lora-engine-adapter``): the engine is built with
vLLM's LoRA support (``enable_lora``, ``max_lora_rank`` the smallest vLLM allows at or above
the rank) and keeps the base weights; a push is the adapter alone
(:class:`~relax_core.contracts.AdapterWeights`), written as a PEFT directory and used from
then on as the ``LoRARequest`` of every generation, under a new adapter id, name and path
(vLLM caches adapters by id, and its prefix cache keys on the name and path); the previous
adapter is removed.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

import torch

from relax_core.batch import length_mask
from relax_core.contracts import AdapterWeights, GenerationOutput, SamplingParams


def vllm_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts (its ``MaxLoRARanks``) that holds an
    adapter of ``rank``.

    Raises:
        ValueError: ``rank`` is above vLLM's largest."""
    import typing

    from vllm.config.lora import MaxLoRARanks

    ranks = tuple(sorted(int(r) for r in typing.get_args(MaxLoRARanks)))
    fits = [r for r in ranks if r >= rank]
    if not fits:
        raise ValueError(f"--lora-rank {rank} is above vLLM's largest adapter rank {ranks[-1]}: use a smaller rank, "
                         "or --no-lora-engine-adapter (merged weights)")
    return fits[0]


def to_generation_output(completions: Sequence[Any], *, pad_id: int, top_k: int) -> GenerationOutput:
    """Pack vLLM ``CompletionOutput`` objects (one per prompt) into a :class:`GenerationOutput`.

    Each completion has ``token_ids``, ``text``, ``finish_reason`` (``"length"`` = cut by
    ``max_tokens``) and ``logprobs``: one mapping per generated token, ``token id ->
    Logprob(logprob, rank)`` holding the sampled token and the ``top_k`` best (ranks 1..k).

    Returns:
        response_ids/log_probs ``[B, T]`` (``T`` = longest response, at least 1; ``pad_id``
        and 0.0 past each response), top-k ids/log-probs ``[B, T, k]`` sorted by rank when
        ``top_k > 0`` (id 0 and −inf past each response).

    Raises:
        ValueError: a completion lacks log-probs, or its top-k head has fewer than ``k`` entries.
    """
    b = len(completions)
    t = max([len(c.token_ids) for c in completions] + [1])
    ids = torch.full((b, t), pad_id, dtype=torch.long)
    lps = torch.zeros(b, t, dtype=torch.float32)
    top_ids = torch.zeros(b, t, top_k, dtype=torch.long) if top_k else None
    top_lps = torch.full((b, t, top_k), float("-inf"), dtype=torch.float32) if top_k else None
    for i, c in enumerate(completions):
        n = len(c.token_ids)
        if c.logprobs is None or len(c.logprobs) != n:
            raise ValueError("vLLM returned no per-token log-probs (was SamplingParams.logprobs set?)")
        ids[i, :n] = torch.tensor(list(c.token_ids), dtype=torch.long)
        lps[i, :n] = torch.tensor([float(pos[tok].logprob) for tok, pos in zip(c.token_ids, c.logprobs)])
        if top_k:
            for j, pos in enumerate(c.logprobs):
                head = sorted(((lp.rank, tok, lp.logprob) for tok, lp in pos.items() if lp.rank <= top_k))[:top_k]
                if len(head) < top_k:
                    raise ValueError(f"vLLM returned {len(head)} top log-probs, fewer than k = {top_k}")
                top_ids[i, j] = torch.tensor([h[1] for h in head])
                top_lps[i, j] = torch.tensor([float(h[2]) for h in head])
    lengths = torch.tensor([len(c.token_ids) for c in completions], dtype=torch.long)
    return GenerationOutput(
        response_ids=ids,
        response_lengths=lengths,
        loss_mask=length_mask(lengths, ids.shape[1]),
        rollout_log_probs=lps,
        truncated=torch.tensor([c.finish_reason == "length" for c in completions], dtype=torch.bool),
        responses=[c.text for c in completions],
        top_k_ids=top_ids,
        top_k_log_probs=top_lps,
    )


def vllm_sampling_params(s: SamplingParams, n_prompts: int) -> list[Any]:
    """One ``vllm.SamplingParams`` per prompt.  With ``s.seed`` set, prompt ``i`` gets seed
    ``s.seed + i`` (repeated prompts of a group must not draw the same sample); without it,
    the engine's global seeded stream is used."""
    from vllm import SamplingParams as VSP

    common = dict(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k if s.top_k > 0 else 0,
                  max_tokens=s.max_new_tokens, repetition_penalty=s.repetition_penalty, stop=list(s.stop),
                  include_stop_str_in_output=True, logprobs=s.return_top_k)
    return [VSP(seed=None if s.seed is None else s.seed + i, **common) for i in range(n_prompts)]


class VLLMEngine:
    """:class:`~relax_core.contracts.RolloutEngine` on an in-process ``vllm.LLM``."""

    def __init__(self, model_path: str, tokenizer: Any, *, seed: int = 0, max_model_len: int = 2048,
                 tensor_parallel_size: int = 1, cpu_kv_cache_gib: int = 1,
                 gpu_memory_utilization: float = 0.5, enforce_eager: bool = True, max_top_k: int = 20,
                 lora_rank: int = 0) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cpu_kv_cache_gib))
        from vllm import LLM

        kwargs: dict[str, Any] = {}
        if torch.cuda.is_available():
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if lora_rank:
            kwargs.update(enable_lora=True, max_lora_rank=vllm_lora_rank(lora_rank), max_loras=1)
        self.llm = LLM(model=model_path, tokenizer=model_path, dtype="float32" if not torch.cuda.is_available() else "auto",
                       seed=seed, max_model_len=max_model_len, tensor_parallel_size=tensor_parallel_size,
                       enforce_eager=enforce_eager, logprobs_mode="processed_logprobs", max_logprobs=max_top_k,
                       **kwargs)
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.version = 0
        self._weights_dir = Path(tempfile.mkdtemp(prefix="relax-vllm-weights-"))
        self.lora_rank = lora_rank
        self._lora: Any = None  # the LoRARequest of the adapter pushed last (None: the base weights)

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> GenerationOutput:
        """Sample one response per prompt (repeat a prompt for a group).

        Raises:
            ValueError: no prompts; routed experts asked (not recorded by this engine); a
                top-k head asked with greedy decoding or with top-p/top-k truncation.
        """
        from vllm.inputs import TokensPrompt

        if sampling.return_routed_experts:
            raise ValueError("the vllm engine does not record routed experts; use --rollout-engine sglang or hf")
        if not prompt_ids:
            raise ValueError("generate() needs at least one prompt")
        if sampling.return_top_k and (sampling.temperature == 0 or sampling.top_p < 1 or sampling.top_k > 0):
            raise ValueError("a top-k head needs temperature > 0, top-p 1 and top-k off (it is the full-vocabulary "
                             f"softmax at the sampling temperature); got {sampling}")
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids],
                                 vllm_sampling_params(sampling, len(prompt_ids)), use_tqdm=False,
                                 lora_request=self._lora)
        out = to_generation_output([o.outputs[0] for o in outs], pad_id=self.pad_id, top_k=sampling.return_top_k)
        if sampling.temperature == 0:  # greedy: a point mass
            out = out.replace(rollout_log_probs=torch.zeros_like(out.rollout_log_probs))
        return out

    def update_weights(self, state_dict: Any, version: int) -> None:
        """Load new weights (Hugging Face names) in place, without restarting the engine; an
        :class:`~relax_core.contracts.AdapterWeights` (LoRA runs) replaces the adapter instead.

        Raises:
            ValueError: an adapter given to an engine built without LoRA support."""
        from safetensors.torch import save_file

        if isinstance(state_dict, AdapterWeights):
            self._set_adapter(state_dict, version)
            return

        path = self._weights_dir / "model.safetensors"
        # clone: tied tensors (lm_head = embed_tokens) share storage, which safetensors refuses
        save_file({k: v.detach().to("cpu", torch.float32).clone() for k, v in state_dict.items()}, str(path))
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(self._weights_dir)})
        self.llm.reset_prefix_cache()
        path.unlink()
        self.version = version

    def _set_adapter(self, adapter: AdapterWeights, version: int) -> None:
        from vllm.lora.request import LoRARequest

        if not self.lora_rank:
            raise ValueError("a LoRA adapter was pushed to a vllm engine built without LoRA support "
                             "(its factory reads --lora-rank)")
        previous = self._lora
        number = 1 if previous is None else previous.lora_int_id + 1
        path = self._weights_dir / f"adapter-{number}"
        adapter.save(path)
        self._lora = LoRARequest(f"relax-step-{version}", number, str(path))
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)
        self.version = version

    def shutdown(self) -> None:
        engine = getattr(self, "llm", None)
        if engine is not None:
            core = getattr(engine.llm_engine, "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
            self.llm = None
        shutil.rmtree(self._weights_dir, ignore_errors=True)


def build(params: Any, config: Any) -> VLLMEngine:
    """Factory: an engine for ``config.model`` (the embedded default resolves to its converted
    Hugging Face directory).

    Raises:
        ImportError: the engine's package is not installed (the message gives the install line).
    """
    if importlib.util.find_spec("vllm") is None:
        from relax_vllm.plugin import INSTALL_HINT

        raise ImportError(f"--rollout-engine vllm needs vLLM, which is not installed: {INSTALL_HINT}")
    from relax_core.models import load_tokenizer, resolve_model_path

    return VLLMEngine(resolve_model_path(config.model), load_tokenizer(config.model), seed=config.seed,
                      max_model_len=params.max_model_len, tensor_parallel_size=config.rollout_num_gpus_per_engine,
                      cpu_kv_cache_gib=params.cpu_kv_cache_gib, gpu_memory_utilization=params.gpu_memory_utilization,
                      enforce_eager=params.enforce_eager,
                      lora_rank=config.lora_rank if config.lora_engine_adapter else 0)
