"""Rollout speed of the vllm engine vs the hf engine on SmolLM2-135M-Instruct, same batch.

    .venv-vllm/bin/python benchmarks/engines.py [--prompts 4] [--samples 8] [--new-tokens 64]

Run it in the vLLM venv (``.ci/vllm.sh`` builds ``.venv-vllm``; the hf engine is installed
there too).  Both engines are loaded side by side and get the same ``prompts × samples``
chat-formatted prompts (arithmetic questions), temperature 1, seeded, with per-token
log-probs; after one warm-up call each, the timed calls alternate hf, vllm, hf, vllm, ...
(``--repeats`` each) so that load from other processes falls on both alike.  Prints the
generated tokens/s of each engine (response tokens up to and including EOS, over the wall
time of ``generate``), the ratio vllm / hf, and the machine's load average before and after
(on a shared machine the absolute rates mean little; the ratio is the measurement); with
``--out FILE`` also writes them there.
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    import torch

    from relax_core.config import RunConfig
    from relax_core.contracts import SamplingParams
    from relax_core.host.plugins import default_registry

    cfg = RunConfig(seed=0)
    reg = default_registry()
    questions = [f"What is {i + 2} + {2 * i + 3}? Give only the final number." for i in range(a.prompts)]
    lines = [f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs; batch "
             f"{a.prompts} prompts × {a.samples} samples, ≤ {a.new_tokens} new tokens, temperature 1, fp32, "
             f"{a.repeats} alternating timed calls per engine",
             "load average (1/5/15 min) before: " + " ".join(f"{x:.1f}" for x in os.getloadavg())]
    engines, batches = {}, {}
    for name in ("hf", "vllm"):
        t0 = time.perf_counter()
        eng = reg.get("engine", name).spec.build(None, cfg)
        lines.append(f"{name:5s} load {time.perf_counter() - t0:6.1f} s")
        tok = eng.tokenizer
        texts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
                 for q in questions]
        ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        batches[name] = [p for p in ids for _ in range(a.samples)]
        eng.generate(batches[name][:2], SamplingParams(max_new_tokens=8, seed=1))  # warm-up
        engines[name] = eng
    assert batches["hf"] == batches["vllm"], "the two engines tokenised the prompts differently"
    tokens = {n: 0 for n in engines}
    seconds = {n: 0.0 for n in engines}
    for r in range(a.repeats):
        for name, eng in engines.items():
            t0 = time.perf_counter()
            out = eng.generate(batches[name], SamplingParams(max_new_tokens=a.new_tokens, seed=100 + r))
            seconds[name] += time.perf_counter() - t0
            tokens[name] += int(out.response_lengths.sum())
    rates = {n: tokens[n] / seconds[n] for n in engines}
    for n in engines:
        lines.append(f"{n:5s} {tokens[n]:6d} tokens in {seconds[n]:7.1f} s   {rates[n]:7.1f} tok/s")
        engines[n].shutdown()
    lines.append("load average (1/5/15 min) after:  " + " ".join(f"{x:.1f}" for x in os.getloadavg()))
    lines.append(f"ratio vllm / hf = {rates['vllm'] / rates['hf']:.2f}")
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
