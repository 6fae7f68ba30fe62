"""Training time per step with each exact lever of issue 24 off and on, alternated in one run.

Lever so far: ``--shared-prefix`` (torch backend; Prefix Grouper, arXiv 2506.05433).  The
workload mimics the default run: ``--rollout-batch-size`` prompts × ``--n-samples-per-prompt``
responses, prompts of ``--prompt-len`` tokens, response lengths uniform in ``[1, --max-response]``.
One "train step" is what the torch backend does per step: a no-grad forward for the old
log-probs plus ``accumulate_gradients`` (forward + backward) of a GRPO-like token-mean loss.
Off and on alternate ``--repeats`` times (warm-up excluded); medians and on/off ratios.

    .venv/bin/python benchmarks/step_speed.py [--model tiny|default|PATH] [--smoke] [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from relax_core.batch import Batch
from relax_core.config import RunConfig


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny", help="tiny (random Qwen3), default (SmolLM2-135M) or a path")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=52)
    ap.add_argument("--max-response", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="tiny model, 2 prompts × 4 samples, 1 repeat (checks it runs)")
    a = ap.parse_args()
    from relax_torch.backend import TorchBackend
    from relax_torch.plugin import TorchBackendParams

    if a.smoke:
        a.model, a.repeats, a.prompts, a.n, a.max_response = "tiny", 1, 2, 4, 16
    if a.model == "tiny":
        from relax_core.models import make_tiny_model

        path = str(make_tiny_model(tempfile.mkdtemp(prefix="step-speed-"), seed=0))
    elif a.model == "default":
        from relax_core.models import ensure_default_model

        path = str(ensure_default_model())
    else:
        path = a.model
    torch.manual_seed(0)
    batch = workload(a.prompts, a.n, a.prompt_len, a.max_response)
    loss = Loss(float(batch.loss_mask.sum()))
    cfg = RunConfig(model=path, lr=1e-6)
    bes = {name: TorchBackend(TorchBackendParams(shared_prefix=on), cfg) for name, on in (("off", False), ("on", True))}
    times: dict[str, list[float]] = {k: [] for k in bes}
    for r in range(a.repeats + 1):
        for name, be in bes.items():
            t = time.perf_counter()
            be.forward(batch)
            be.accumulate_gradients(batch, loss)
            if r:  # the first round warms up
                times[name].append(time.perf_counter() - t)
    real = int(batch.loss_mask.sum()) + sum(len(p) for p in batch.prompt_ids)
    print(f"model={a.model} samples={batch.size} prompt_len={a.prompt_len} max_response={a.max_response} "
          f"threads={torch.get_num_threads()} repeats={a.repeats}")
    print("| lever | train s/step (median) | positions computed | real tokens (plain) |")
    print("| --- | --- | --- | --- |")
    for name, be in bes.items():
        print(f"| shared_prefix={name} | {statistics.median(times[name]):.3f} | {be.packed_positions(batch)} | {real} |")
    ratio = statistics.median(times["on"]) / statistics.median(times["off"])
    print(f"shared_prefix_train_time_ratio: {ratio:.3f}")


if __name__ == "__main__":
    main()
