"""Speed of the default engine and backend on SmolLM2-135M-Instruct (CPU or CUDA).

    python benchmarks/hf_torch_smollm2.py [--samples 32] [--new-tokens 64] [--bf16]

Prints: generation tokens/s for ``samples`` responses of exactly ``new-tokens`` tokens
(EOS disabled so every row decodes the full length) and with natural EOS; the seconds of
one no-grad forward (old log-probs) and of one optimizer step (forward + backward + AdamW,
:func:`relax_core.stages.optimizer.optimizer_step`)
on ``samples × (prompt + new-tokens)`` tokens, with and without gradient checkpointing.
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--skip-train", action="store_true")
    a = ap.parse_args()

    from relax_core.batch import Batch
    from relax_core.config import RunConfig
    from relax_core.contracts import SamplingParams
    from relax_core.stages.optimizer import OptimizerSettings, optimizer_step
    from relax_hf.engine import build as build_engine
    from relax_hf.plugin import HFEngineParams
    from relax_torch.backend import build as build_backend
    from relax_torch.plugin import TorchBackendParams

    cfg = RunConfig(device=a.device, bf16=a.bf16, lr=1e-6)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {a.device}")
    t0 = time.perf_counter()
    eng = build_engine(HFEngineParams(), cfg)
    print(f"engine load: {time.perf_counter() - t0:.2f} s")
    tok = eng.tokenizer
    qs = ["What is 3 + 5?", "What is 7 + 2?", "What is 4 + 4?", "What is 9 + 1?"]
    prompts = [tok.apply_chat_template([{"role": "user", "content": q + " Give only the final number."}],
                                       add_generation_prompt=True)["input_ids"] for q in qs]
    prompts = [p for p in prompts for _ in range(a.samples // len(qs))]
    s = SamplingParams(temperature=cfg.rollout_temperature, max_new_tokens=a.new_tokens, seed=0)  # backend's τ too
    eng.generate(prompts[:2], SamplingParams(max_new_tokens=4, seed=0))  # warm-up
    eos = eng.eos_token_ids
    eng.eos_token_ids = []
    t0 = time.perf_counter()
    out = eng.generate(prompts, s)
    dt = time.perf_counter() - t0
    n = int(out.response_lengths.sum())
    print(f"generate {len(prompts)}x{a.new_tokens} (no EOS): {dt:.2f} s, {n / dt:.0f} tokens/s")
    eng.eos_token_ids = eos
    t0 = time.perf_counter()
    nat = eng.generate(prompts, s)
    dt = time.perf_counter() - t0
    n2 = int(nat.response_lengths.sum())
    print(f"generate with EOS: {dt:.2f} s, {n2} tokens, {n2 / dt:.0f} tokens/s, mean length {n2 / len(prompts):.1f}")
    if a.skip_train:
        return
    mask = torch.ones_like(out.response_ids, dtype=torch.bool)
    g = torch.Generator().manual_seed(0)
    batch = Batch(prompt_ids=prompts, response_ids=out.response_ids, loss_mask=mask,
                  advantages=torch.randn(mask.shape, generator=g))
    n_tok = float(mask.sum())

    def loss_fn(mb, fo):
        loss = -(mb.advantages * fo.log_probs)[mb.loss_mask].sum() / n_tok
        return loss, {}

    print(f"train batch: {len(prompts)} x ({len(prompts[0])} prompt + {a.new_tokens}) tokens")
    for ckpt in (False, True):
        cfg = RunConfig(device=a.device, bf16=a.bf16, lr=1e-6, gradient_checkpointing=ckpt)
        be = build_backend(TorchBackendParams(), cfg)
        t0 = time.perf_counter()
        lp = be.forward(batch).log_probs
        t_fwd = time.perf_counter() - t0
        diff = (lp - out.rollout_log_probs)[mask].abs()
        t0 = time.perf_counter()
        m = optimizer_step(be, batch, loss_fn, role="actor", settings=OptimizerSettings.from_config(cfg))
        t_step = time.perf_counter() - t0
        print(f"grad ckpt {ckpt}: forward (no grad) {t_fwd:.2f} s, optimizer step {t_step:.2f} s "
              f"(grad_norm {m.grad_norm:.3f}); |engine - backend log-prob| mean {diff.mean():.2e} max {diff.max():.2e}")
        del be


if __name__ == "__main__":
    main()
