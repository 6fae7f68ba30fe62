"""Training time and memory per step with each lever of issue 24 off and on, alternated in one run.

Levers (torch backend): ``--shared-prefix`` (Prefix Grouper, arXiv 2506.05433), ``--packing``
(with ``--max-tokens-per-micro-batch``), ``--selective-checkpointing`` (element-wise operations
recomputed in the backward), all exact and on by default; ``--bf16`` (autocast, not exact, on
by default only where the CPU has AMX).  The workload mimics the default run: ``--prompts`` prompts ×
``--n`` responses, prompts of ``--prompt-len`` tokens, response lengths uniform in
``[1, --max-response]``.  One "train step" is what the torch backend does per step: a no-grad
forward for the old log-probs, ``accumulate_gradients`` (forward + backward) of a GRPO-like
token-mean loss and the AdamW step (learning rate 0, so every configuration sees the same
weights).  The configurations share one backend (its layout switches are set between steps)
and alternate ``--repeats`` times (a warm-up round excluded); medians and ratios to the old
default (plain padded layout, float32).  Rollout is not part of this benchmark.

Per configuration it also reports the padding fraction of the training forward (positions
holding no token), the peak RSS of a fresh process running one step of it alone
(``VmHWM``, not ``ru_maxrss``, which in a forked child counts the parent's RSS at the
fork; with its parts: after loading the model, after the first step, whose AdamW
state then exists), and for ``bf16`` the log-prob mismatch against the float32 forward (the
float32 hf engine's log-probs are the float32 trainer's): mean and max of
``|log p_fp32 − log p_bf16|`` over the response tokens.

    .venv/bin/python benchmarks/step_speed.py [--model tiny|default|PATH] [--smoke] [--repeats N]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from relax_core.batch import Batch
from relax_core.config import RunConfig

#: name -> (shared_prefix, packing, token budget or None, bf16, selective checkpointing); the
#: first is the old default, the second the new one (float32: bf16 is on by default only on AMX)
CONFIGS = {
    "old_default": (False, False, None, False, False),
    "new_default": (True, True, None, False, True),
    "new_default_no_selective": (True, True, None, False, False),
    "padded_budget": (False, False, "budget", False, False),
    "packing": (False, True, "budget", False, False),
    "shared_prefix+packing": (True, True, "budget", False, False),
    "selective_checkpointing": (False, False, None, False, True),
    "bf16": (False, False, None, True, False),
}


def workload(prompts: int, n: int, prompt_len: int, max_response: int, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    b = prompts * n
    plist = [torch.randint(3, 1000, (prompt_len,), generator=g).tolist() for _ in range(prompts)]
    lengths = torch.randint(1, max_response + 1, (b,), generator=g)
    mask = torch.arange(max_response)[None, :] < lengths[:, None]
    resp = torch.randint(3, 1000, (b, max_response), generator=g)
    return Batch(prompt_ids=[plist[i // n] for i in range(b)], response_ids=resp, loss_mask=mask,
                 group_index=torch.arange(b) // n, advantages=torch.randn(b, max_response, generator=g))


class Loss:
    needs_entropy = True
    needs_top_k = False

    def __init__(self, tokens: float):
        self.n = tokens

    def __call__(self, mb, out):
        loss = torch.where(mb.loss_mask, -mb.advantages * out.log_probs, 0.0).sum() / self.n
        return loss, {}


def configure(be, base_cfg: RunConfig, name: str, budget: int) -> None:
    """Set the backend's layout switches, token budget, autocast and checkpointing to configuration ``name``."""
    from relax_torch.checkpointing import checkpoint_layers

    shared, packing, tb, bf16, selective = CONFIGS[name]
    be.shared_prefix, be.packing = shared, packing
    be.cfg = dataclasses.replace(base_cfg, max_tokens_per_micro_batch=budget if tb else None, bf16=bf16)
    if (be.checkpointing == "selective") != selective:
        model = be.models["actor"]
        model.gradient_checkpointing_disable()
        if getattr(model, "_require_grads_hook", None) is not None:  # enable's embedding hook, once only
            model.disable_input_require_grads()
        be.checkpointing = checkpoint_layers(model, full=False, selective=selective)


def train_step(be, batch: Batch, loss: Loss) -> None:
    be.forward(batch)
    be.accumulate_gradients(batch, loss)
    be.apply_gradients(lr=0.0)
    be.zero_grad()  # as the core's optimizer step: gradients released after it


def rss_gib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def peak_gib() -> float:
    """This process's peak RSS (``VmHWM``: its own address space's high-water mark)."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:")) / 2**20  # KiB


def model_path(name: str) -> str:
    if name == "tiny":
        from relax_authoring.testing.models import make_tiny_model

        return str(make_tiny_model(tempfile.mkdtemp(prefix="step-speed-"), seed=0))
    if name == "default":
        from relax_core.models import ensure_default_model

        return str(ensure_default_model())
    return name


def build(path: str, a) -> tuple:
    from relax_torch.backend import TorchBackend
    from relax_torch.plugin import TorchBackendParams

    torch.manual_seed(0)
    batch = workload(a.prompts, a.n, a.prompt_len, a.max_response)
    cfg = RunConfig(model=path, lr=1e-6)
    return TorchBackend(TorchBackendParams(), cfg), cfg, batch


def memory_of(path: str, name: str, a) -> dict:
    """Run one step of ``name`` alone in this process; its RSS figures (GiB)."""
    be, cfg, batch = build(path, a)
    loaded = rss_gib()
    configure(be, cfg, name, a.budget)
    train_step(be, batch, Loss(float(batch.loss_mask.sum())))
    return {"loaded": loaded, "after_step": rss_gib(), "peak": peak_gib()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny", help="tiny (random Qwen3), default (SmolLM2-135M) or a path")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=52)
    ap.add_argument("--max-response", type=int, default=32)
    ap.add_argument("--budget", type=int, default=1024, help="--max-tokens-per-micro-batch of the budget configurations")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-memory", action="store_true", help="skip the per-configuration peak-RSS processes")
    ap.add_argument("--memory-of", help=argparse.SUPPRESS)  # internal: one configuration's RSS, as JSON
    ap.add_argument("--smoke", action="store_true", help="tiny model, 2 prompts × 4 samples, 1 repeat, one memory process (checks it runs)")
    a = ap.parse_args()
    if a.smoke:
        a.model, a.repeats, a.prompts, a.n, a.max_response, a.budget = "tiny", 1, 2, 4, 16, 128
    path = model_path(a.model)
    if a.memory_of:
        print(json.dumps(memory_of(path, a.memory_of, a)))
        return
    be, cfg, batch = build(path, a)
    loss = Loss(float(batch.loss_mask.sum()))
    times: dict[str, list[float]] = {k: [] for k in CONFIGS}
    for r in range(a.repeats + 1):
        for name in CONFIGS:
            configure(be, cfg, name, a.budget)
            t = time.perf_counter()
            train_step(be, batch, loss)
            if r:  # the first round warms up
                times[name].append(time.perf_counter() - t)
                print(f"round {r} {name}: {times[name][-1]:.3f} s", file=sys.stderr, flush=True)
    layout = {}
    for name in CONFIGS:
        configure(be, cfg, name, a.budget)
        layout[name] = (be.packed_positions(batch), len(be.micro_batches(batch)))
    configure(be, cfg, "old_default", a.budget)
    lp32 = be.forward(batch).log_probs
    configure(be, cfg, "bf16", a.budget)
    diff = (be.forward(batch).log_probs - lp32).abs()[batch.loss_mask]
    memory = {}
    if not a.no_memory:
        for name in (["new_default"] if a.smoke else CONFIGS):
            args = [sys.executable, __file__, "--memory-of", name, "--model", path, "--prompts", str(a.prompts),
                    "--n", str(a.n), "--prompt-len", str(a.prompt_len), "--max-response", str(a.max_response),
                    "--budget", str(a.budget)]
            out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
            memory[name] = json.loads(out.strip().splitlines()[-1])
    real = int(batch.loss_mask.sum()) + sum(len(p) for p in batch.prompt_ids)
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[:3]
    print(f"model={a.model} samples={batch.size} prompt_len={a.prompt_len} max_response={a.max_response} "
          f"budget={a.budget} threads={torch.get_num_threads()} repeats={a.repeats} "
          f"real_tokens_plain={real} loadavg_end={' '.join(load)}")
    print("| configuration | shared_prefix | packing | budget | bf16 | selective ckpt | train s/step (median) "
          "| ratio to old default | micro-batches | positions | padding fraction | peak RSS GiB (loaded → after step) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    base = statistics.median(times["old_default"])
    for name, (shared, packing, tb, bf16, selective) in CONFIGS.items():
        (positions, filled), mbs = layout[name]
        med = statistics.median(times[name])
        m = memory.get(name)
        mem = f"{m['peak']:.2f} ({m['loaded']:.2f} → {m['after_step']:.2f})" if m else "-"
        print(f"| {name} | {shared} | {packing} | {a.budget if tb else '-'} | {bf16} | {selective} | {med:.3f} | {med / base:.3f} "
              f"| {mbs} | {positions} | {1 - filled / positions:.3f} | {mem} |")
    print(f"step_time_ratio: {statistics.median(times['new_default']) / base:.3f}")
    if memory:
        print(f"peak_rss_gib: {memory['new_default']['peak']:.2f}")
    print(f"bf16_train_time_ratio: {statistics.median(times['bf16']) / base:.3f}")
    print(f"bf16_logprob_mismatch: mean {float(diff.mean()):.3e} max {float(diff.max()):.3e} "
          f"(|log p_fp32 - log p_bf16| over {diff.numel()} response tokens)")


if __name__ == "__main__":
    main()
