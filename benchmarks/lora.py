"""LoRA against full fine-tuning on the same work: step time, peak memory, checkpoint size,
and the state memory per parameter that decides the largest model fitting in 24 GB.

Both sides are the torch backend on the same model and batch (the default workload's shape,
as in ``step_speed.py``): one training step is the no-grad forward for the old log-probs,
``accumulate_gradients`` (forward + backward of a token-mean policy-gradient loss) and the
AdamW step.  Full fine-tuning trains every weight; LoRA trains rank-``--rank`` adapters on
the default target modules (``docs/guide/lora.md``).

- **Step time**: the two sides alternate ``--repeats`` times in one process (the first round
  warms up); medians and the LoRA ÷ full ratio.
- **Peak memory**: each side in a fresh subprocess that builds the backend and runs
  ``--rss-steps`` steps; its peak RSS (``VmHWM``) minus the same process's RSS before the
  model loaded (``VmRSS``), so the interpreter and torch's own pages are left out.  (Not
  ``ru_maxrss``: on Linux a child's counts the parent's RSS at the fork.)
- **Checkpoint**: the bytes of ``save_checkpoint`` (the weights the checkpoint holds, with
  the optimizer state).
- **State bytes per parameter**: the trained weights, their gradients and AdamW's two
  moments, counted from the tensors (exact), over the model's parameter count; the 24 GB
  estimate adds the rollout engine's copy of the weights and leaves activations out (say so
  when quoting it).

    .venv/bin/python benchmarks/lora.py [--model default|tiny|PATH] [--rank 16] [--repeats 3] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from step_speed import Loss, model_path, peak_gib, rss_gib, train_step, workload

from relax_core.config import RunConfig

#: bytes per parameter of the rollout engine's copy of the weights (float32), on one machine
ENGINE_BYTES = 4


def backend(path: str, rank: int):
    from relax_torch.backend import TorchBackend
    from relax_torch.plugin import TorchBackendParams

    cfg = RunConfig(model=path, lr=1e-5, lora_rank=rank, lora_alpha=2 * rank)
    return TorchBackend(TorchBackendParams(), cfg)


def state_bytes(be) -> tuple[int, int, int]:
    """(bytes of the trained weights with their gradients and AdamW's two moments, bytes of
    the frozen weights, parameter count of the base model), counted from the tensors."""
    trained = frozen = base = 0
    for name, p in be.models["actor"].named_parameters():
        size = p.numel() * p.element_size()
        if p.requires_grad:
            trained += 4 * size  # weight, grad, exp_avg, exp_avg_sq
        else:
            frozen += size
        if "lora_" not in name:
            base += p.numel()
    return trained, frozen, base


def rss_child(path: str, rank: int, steps: int, shape: dict) -> None:
    """Run in a subprocess: print the peak RSS growth (GiB) of building the backend and training."""
    base = rss_gib()
    torch.manual_seed(0)
    batch = workload(**shape)
    loss = Loss(float(batch.loss_mask.sum()))
    be = backend(path, rank)
    for _ in range(steps):
        train_step(be, batch, loss)
    print(json.dumps({"peak_growth": peak_gib() - base}))


def checkpoint_bytes(be) -> int:
    with tempfile.TemporaryDirectory() as d:
        be.save_checkpoint(d)
        return sum(f.stat().st_size for f in Path(d).rglob("*") if f.is_file())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default", help="default (SmolLM2-135M), tiny (random Qwen3) or a path")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=52)
    ap.add_argument("--max-response", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rss-steps", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="tiny model, 2 prompts × 4 samples, 1 repeat (checks it runs)")
    ap.add_argument("--rss-child", nargs=2, metavar=("PATH", "RANK"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.smoke:
        a.model, a.repeats, a.prompts, a.n, a.max_response, a.rss_steps = "tiny", 1, 2, 4, 16, 1
    shape = dict(prompts=a.prompts, n=a.n, prompt_len=a.prompt_len, max_response=a.max_response)
    if a.rss_child:
        rss_child(a.rss_child[0], int(a.rss_child[1]), a.rss_steps, shape)
        return
    path = model_path(a.model)
    torch.manual_seed(0)
    batch = workload(**shape)
    loss = Loss(float(batch.loss_mask.sum()))
    sides = {"full": backend(path, 0), "lora": backend(path, a.rank)}
    times: dict[str, list[float]] = {k: [] for k in sides}
    for r in range(a.repeats + 1):
        for name, be in sides.items():
            t = time.perf_counter()
            train_step(be, batch, loss)
            if r:  # the first round warms up
                times[name].append(time.perf_counter() - t)
    rows = {}
    for name, be in sides.items():
        rank = 0 if name == "full" else a.rank
        child = subprocess.run([sys.executable, __file__, "--rss-child", path, str(rank), "--rss-steps", str(a.rss_steps),
                                "--prompts", str(a.prompts), "--n", str(a.n), "--prompt-len", str(a.prompt_len),
                                "--max-response", str(a.max_response)], capture_output=True, text=True, check=True)
        growth = json.loads(child.stdout.strip().splitlines()[-1])["peak_growth"]
        trained, frozen, params = state_bytes(be)
        per_param = (trained + frozen) / params + ENGINE_BYTES
        rows[name] = dict(step=statistics.median(times[name]), peak=growth, ckpt=checkpoint_bytes(be), state=trained,
                          params=params, per_param=per_param)
    print(f"model={a.model} params={rows['full']['params'] / 1e6:.1f}M rank={a.rank} samples={batch.size} "
          f"prompt_len={a.prompt_len} max_response={a.max_response} threads={torch.get_num_threads()} repeats={a.repeats}")
    print("| side | train step s (median) | peak RSS growth GiB | checkpoint MiB | trained state MiB | "
          "weights + state + engine B/param | largest model in 24 GB (no activations) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, r in rows.items():
        print(f"| {name} | {r['step']:.3f} | {r['peak']:.2f} | {r['ckpt'] / 2**20:.1f} | {r['state'] / 2**20:.1f} "
              f"| {r['per_param']:.2f} | {24e9 / r['per_param'] / 1e9:.2f} B params |")
    print(f"lora_step_time_ratio: {rows['lora']['step'] / rows['full']['step']:.3f}")
    if rows["full"]["peak"] > 0:  # (the tiny model of --smoke may not raise the peak the imports set)
        print(f"lora_peak_rss_ratio: {rows['lora']['peak'] / rows['full']['peak']:.3f}")
    print(f"lora_checkpoint_ratio: {rows['lora']['ckpt'] / rows['full']['ckpt']:.4f}")


if __name__ == "__main__":
    main()
