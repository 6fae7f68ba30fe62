"""What the Ray optimizer step's driver <-> worker round trips cost, beside the step itself.

Under ``--launcher ray`` the core's one optimizer step
(:func:`relax_core.stages.optimizer.optimizer_step`) runs in the driver over
:class:`relax_core.distributed.proxies.RayBackend`, which turns each backend call into one
call per training rank: ``accumulate_gradients`` (the forward and backward, where the work
is), then four control calls, ``grad_norm``, ``optimizer_steps``, ``apply_gradients`` and
``zero_grad``.  This script measures those four through the real ``RayBackend`` on training
ranks that do nothing (actors answering at once), so what is timed is Ray's messaging alone,
for 1 and 2 ranks, and, in the same run, one local step of the tiny model's training
(forward, backward and AdamW on 32 samples × 32 tokens, the batch of ``benchmarks/async.py``)
for scale.

Run:  .venv/bin/python benchmarks/ray_round_trips.py [--calls 200] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def _control_seconds(ranks: int, calls: int) -> list[float]:
    """Seconds of the four control calls of one optimizer step, ``calls`` times, on
    ``ranks`` do-nothing training ranks behind the real ``RayBackend``."""
    import ray

    from relax_core.distributed.proxies import RayBackend

    @ray.remote(num_cpus=0)
    class IdleRank:
        def __init__(self, rank: int):
            self.rank = rank

        def data_parallel(self):
            return self.rank, ranks

        def grad_norm(self, role):
            return 1.0

        def optimizer_steps(self, role):
            return 0

        def apply_gradients(self, role, lr, grad_scale):
            return None

        def zero_grad(self, role):
            return None

    proxy = RayBackend([IdleRank.remote(r) for r in range(ranks)])
    out = []
    for _ in range(calls + 5):
        t0 = time.perf_counter()
        proxy.grad_norm("actor")
        proxy.optimizer_steps("actor")
        proxy.apply_gradients("actor", lr=1e-5, grad_scale=1.0)
        proxy.zero_grad("actor")
        out.append(time.perf_counter() - t0)
    return out[5:]  # the first calls warm the actors up


def _local_step_seconds(repeats: int) -> list[float]:
    """Seconds of one forward + backward + AdamW step of the tiny model on 32 × (16 + 32)
    tokens, in this process (the compute a Ray step wraps)."""
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM

    from relax_authoring.testing.models import make_tiny_model

    with tempfile.TemporaryDirectory() as d:
        model = AutoModelForCausalLM.from_pretrained(make_tiny_model(d), dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, model.config.vocab_size, (32, 48))
    out = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        logits = model(input_ids=ids).logits
        torch.log_softmax(logits.float(), -1).mean().backward()
        opt.step()
        opt.zero_grad()
        out.append(time.perf_counter() - t0)
    return out[1:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200, help="optimizer steps' control calls timed per configuration")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: check that the script runs")
    a = ap.parse_args(argv)
    calls, repeats = (10, 2) if a.smoke else (a.calls, 10)
    load = os.getloadavg()[0]
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        control = {n: _control_seconds(n, calls) for n in (1, 2)}
    finally:
        ray.shutdown()
    step = statistics.median(_local_step_seconds(repeats))
    print(f"load average before: {load:.2f}; {calls} optimizer steps' control calls per row; "
          f"tiny-model local step (32 x 48 tokens, fwd+bwd+AdamW): median {step * 1e3:.1f} ms over {repeats}")
    print("| training ranks | 4 control calls per optimizer step: median ms (p90) | share of the tiny local step |")
    print("|---|---|---|")
    for n, secs in control.items():
        med = statistics.median(secs)
        p90 = sorted(secs)[int(0.9 * (len(secs) - 1))]
        print(f"| {n} | {med * 1e3:.2f} ({p90 * 1e3:.2f}) | {med / step:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
