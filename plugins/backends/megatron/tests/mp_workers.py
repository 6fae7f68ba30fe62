"""Worker processes for the megatron tests (Megatron's parallel state is per process, so
every check runs in fresh processes started with ``torch.multiprocessing``)."""

from __future__ import annotations

import importlib.util
import os
import socket

import pytest
import torch

VOCAB = 256

#: skip a test when megatron-core is not installed
needs_megatron = pytest.mark.skipif(importlib.util.find_spec("megatron") is None,
                                    reason="megatron-core not installed (pip install -e 'plugins/backends/megatron[backend]')")


def free_port() -> int:
    """A free localhost TCP port for a process group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_step(be, batch, loss_fn) -> dict:
    """The core's optimizer step of the actor (lr 1e-3, no clipping, no warm-up) as a plain
    dict (:class:`relax_core.contracts.StepResult`'s fields), for ``torch.save``."""
    import dataclasses

    from relax_core.stages.optimizer import OptimizerSettings, optimizer_step

    settings = OptimizerSettings(lr=1e-3, critic_lr=1e-3, warmup_steps=0, clip_grad=0.0)
    return dataclasses.asdict(optimizer_step(be, batch, loss_fn, role="actor", settings=settings))


def tiny_hf(kind: str, seed: int = 0):
    """A random tiny HF causal LM (float32, eval), deterministic in ``seed``."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
           "qwen3": (Qwen3Config, Qwen3ForCausalLM)}[kind]
    cfg = cls[0](vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                 tie_word_embeddings=kind == "qwen3", rms_norm_eps=1e-6)
    torch.manual_seed(seed)
    model = cls[1](cfg).float().eval()
    with torch.no_grad():  # HF zero-inits biases and ones-inits norms: perturb everything
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def tiny_batch(seed: int = 1):
    """4 samples: prompts of lengths 3..6, responses of 5 positions with masked tails whose
    ids are garbage (-1 and 10**6) and whose advantages are NaN."""
    from relax_core.batch import Batch

    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (3, 6, 4, 5)]
    resp = torch.randint(0, VOCAB, (4, 5), generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)
    resp = resp.masked_fill(~mask, -1)
    resp[3, 4] = 10**6
    adv = torch.randn(4, 1, generator=g).expand(4, 5).clone().masked_fill(~mask, float("nan"))
    top = torch.randint(0, VOCAB, (4, 5, 3), generator=g)
    return Batch(prompt_ids=prompts, response_ids=resp, loss_mask=mask, advantages=adv, top_k_ids=top)


class ToyLoss:
    """REINFORCE token-mean with an entropy bonus; masked positions replaced by 0 before use."""

    needs_entropy = True
    needs_top_k = False

    def __init__(self, num_tokens: float, nan: bool = False):
        self.n, self.nan = num_tokens, nan

    def __call__(self, mb, out):
        m = mb.loss_mask
        adv = torch.where(m, mb.advantages, 0.0)
        lp = torch.where(m, out.log_probs, 0.0)
        ent = torch.where(m, out.entropy, 0.0)
        loss = (-(adv * lp).sum() - 0.01 * ent.sum()) / self.n
        return (loss * float("nan") if self.nan else loss), {}


TEMPERATURE = 0.7


def hf_reference(model, batch, steps_lr: float):
    """log-probs, entropy and top-k log-probs from transformers, then one AdamW step on
    the HF model with :class:`ToyLoss` (same packing as the backend)."""
    from relax_megatron.backend import pack_sequences

    ids, _, at = pack_sequences(batch.prompt_ids, batch.response_ids.clamp(0, VOCAB - 1))

    def stats():
        logits = model(ids).logits.float() / TEMPERATURE
        lsm = torch.log_softmax(logits.gather(1, at[..., None].expand(-1, -1, VOCAB)), -1)  # [b, T, V]
        lp = lsm.gather(-1, batch.response_ids.clamp(0, VOCAB - 1)[..., None]).squeeze(-1)
        ent = -(lsm.exp() * lsm).sum(-1)
        return lp, ent, lsm.gather(-1, batch.top_k_ids)

    with torch.no_grad():
        lp, ent, top = stats()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=steps_lr)
    lp2, ent2, _ = stats()
    out = type("O", (), {"log_probs": lp2, "entropy": ent2})
    loss, _ = ToyLoss(float(batch.loss_mask.sum()))(batch, out)
    loss.backward()
    grad_norm = float(torch.sqrt(sum(p.grad.double().pow(2).sum() for p in model.parameters() if p.grad is not None)))
    opt.step()
    return {"log_probs": lp, "entropy": ent, "top_k": top, "loss": float(loss), "grad_norm": grad_norm,
            "after": {k: v.detach().clone() for k, v in model.state_dict().items()}}


def worker(rank: int, world: int, port: int, kind: str, out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from relax_megatron.backend import MegatronBackend

    hf = tiny_hf(kind)
    batch = tiny_batch()
    be = MegatronBackend(hf.config, hf.state_dict(), tp=world, micro_batch_size=2,
                         temperature=TEMPERATURE, ref_loader=lambda: tiny_hf(kind).state_dict())
    be.setup(needs_ref=True)
    fwd = be.forward(batch, entropy=True, top_k=True)
    n = float(batch.loss_mask.sum())
    before = be.engine_state_dict()
    skipped = train_step(be, batch, ToyLoss(n, nan=True))
    unchanged = max((be.engine_state_dict()[k] - before[k]).abs().max().item() for k in before)
    stepped = train_step(be, batch, ToyLoss(n))
    spread = 0.0  # replicated (norm) weights must stay equal on every TP rank
    if world > 1:
        for name, p in be.model.named_parameters():
            if "layernorm" in name:
                parts = [torch.empty_like(p) for _ in range(world)]
                torch.distributed.all_gather(parts, p.detach().contiguous())
                spread = max(spread, max((x - parts[0]).abs().max().item() for x in parts))
    ckpt = out_path + ".ckpt"  # one directory for all TP ranks
    be.save_checkpoint(ckpt)
    saved = be.engine_state_dict()
    train_step(be, batch, ToyLoss(n))
    moved_again = max((be.engine_state_dict()[k] - saved[k]).abs().max().item() for k in saved)
    be.load_checkpoint(ckpt)
    restored = max((be.engine_state_dict()[k] - saved[k]).abs().max().item() for k in saved)
    restored_step = be.step
    ref_lp = be.forward(batch, role="ref").log_probs
    actor_lp = be.forward(batch).log_probs
    res = {"ckpt": (moved_again, restored, restored_step), "ref_log_probs": ref_lp, "actor_after": actor_lp,"log_probs": fwd.log_probs, "entropy": fwd.entropy, "top_k": fwd.top_k_log_probs,
           "skipped": skipped, "unchanged": unchanged, "stepped": stepped, "spread": spread, "before": before,
           "after": be.engine_state_dict(), "step": be.step}
    if rank == 0:
        if world == 1:
            res["logits_diff"] = {}
            for k in ("llama", "qwen2", "qwen3"):
                ref = tiny_hf(k, seed=3)
                b2 = MegatronBackend.__new__(MegatronBackend)  # reuse the process's parallel state
                b2.__dict__.update(be.__dict__)
                b2.arch = __import__("relax_megatron.convert", fromlist=["x"]).arch_from_hf_config(ref.config)
                b2.model = b2._build(ref.state_dict())
                ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(5))
                causal = torch.triu(torch.ones(11, 11, dtype=torch.bool), 1)[None, None]
                with torch.no_grad():
                    got = b2.model(ids, torch.arange(11).expand(2, 11), causal)
                    want = ref(ids).logits
                res["logits_diff"][k] = (got - want).abs().max().item()
            res["hf"] = hf_reference(tiny_hf(kind), batch, 1e-3)
        torch.save(res, out_path)


def cuda_vs_torch_worker(rank: int, port: int, model_dir: str, out_path: str) -> None:
    """One CUDA process (NCCL, TP = 1): the megatron and torch backends built from the same
    Hugging Face directory; their float32 log-probs and entropies of :func:`tiny_batch`."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    from relax_core.config import RunConfig
    from relax_core.models import load_model
    from relax_megatron.backend import MegatronBackend
    from relax_torch.backend import TorchBackend
    from relax_torch.plugin import TorchBackendParams

    hf = load_model(model_dir)
    batch = tiny_batch()
    meg = MegatronBackend(hf.config, hf.state_dict(), tp=1, temperature=TEMPERATURE, device="cuda")
    tor = TorchBackend(TorchBackendParams(dtype="float32"),
                       RunConfig(model=model_dir, device="cuda", rollout_temperature=TEMPERATURE))
    out = {}
    for name, be in (("megatron", meg), ("torch", tor)):
        f = be.forward(batch, entropy=True)
        out[name] = {"log_probs": f.log_probs.cpu(), "entropy": f.entropy.cpu()}
    out["mask"] = batch.loss_mask
    torch.save(out, out_path)
