"""Rollout speed of the vllm engine vs the hf engine on SmolLM2-135M-Instruct, same batch.

    .venv-vllm/bin/python benchmarks/engines.py [--prompts 4] [--samples 8] [--new-tokens 64]

Run it in the vLLM venv (``.ci/vllm.sh`` builds ``.venv-vllm``; the hf engine is installed
there too).  Both engines get the same ``prompts × samples`` chat-formatted prompts (the
default data's arithmetic questions), temperature 1, seeded, with per-token log-probs; one
warm-up call each, then ``--repeats`` timed calls.  Prints generated tokens/s of each engine
(response tokens up to and including EOS, over wall time of ``generate``) and the ratio
vllm / hf; with ``--out FILE`` also writes them there.
"""

from __future__ import annotations

import argparse
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
    from relax_core.plugins import default_registry

    cfg = RunConfig(seed=0)
    reg = default_registry()
    questions = [f"What is {i + 2} + {2 * i + 3}? Give only the final number." for i in range(a.prompts)]
    lines = [f"torch {torch.__version__}, {torch.get_num_threads()} threads; batch {a.prompts} prompts × "
             f"{a.samples} samples, ≤ {a.new_tokens} new tokens, temperature 1, fp32"]
    rates = {}
    for name in ("hf", "vllm"):
        spec = reg.get("engine", name).spec
        t0 = time.perf_counter()
        eng = spec.build(None, cfg)
        load = time.perf_counter() - t0
        tok = eng.tokenizer
        texts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
                 for q in questions]
        ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        batch = [p for p in ids for _ in range(a.samples)]
        eng.generate(batch[:2], SamplingParams(max_new_tokens=8, seed=1))  # warm-up
        tokens, seconds = 0, 0.0
        for r in range(a.repeats):
            t0 = time.perf_counter()
            out = eng.generate(batch, SamplingParams(max_new_tokens=a.new_tokens, seed=100 + r))
            seconds += time.perf_counter() - t0
            tokens += int(out.response_lengths.sum())
        rates[name] = tokens / seconds
        lines.append(f"{name:5s} load {load:6.1f} s   {tokens:6d} tokens in {seconds:6.1f} s   {rates[name]:7.1f} tok/s")
        eng.shutdown()
        del eng
    lines.append(f"ratio vllm / hf = {rates['vllm'] / rates['hf']:.2f}")
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
