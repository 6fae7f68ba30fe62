"""The algorithm stage of every estimator, side by side with a loop-style implementation and
with the machine's bandwidth floor.

One *algorithm stage* is what the trainer runs between the model's forward and backward:

    advantages (estimator.compute_advantages, on the whole batch)
    → per-token policy loss (estimator.policy_loss) → corrections (tis / icepop)
    → the run's reduction and metrics (relax_core.loss.ActorLoss) → backward to log π_θ.

Three ways of doing the same work on the same tensors, alternated and repeated in one process:

- **relax**: the installed plugins through ``ActorLoss`` (exactly the trainer's code path;
  the metrics ``pg_clipfrac``, ``ppo_kl`` and the corrections' metrics included).
- **loop**: the same formulas written the way the peers' public code writes them: group
  statistics with a Python loop over groups (:func:`estimators.loop_advantages`), returns
  (GAE, REINFORCE++) with a Python loop over each sample's tokens, the loss one sample at a
  time (one tensor per sample, as a per-sample forward gives them, cut to its length; Python
  accumulation of loss, clipfrac and ppo_kl).  Indexing the padded batch per sample instead
  (``log_probs[i, :n]``) would make the backward quadratic in B (each index builds a full
  ``[B, T]`` gradient): that is a trap, not a baseline, and is avoided here.
- **grpo, lean reference**: grpo's stage as one hand-written function with the fewest
  passes eager PyTorch allows (:func:`lean_grpo_stage`): how fast the plugin path could be
  without fusion.
- **floor**: the time to read every input tensor once and write the gradient once, at the
  bandwidth an elementwise ``torch.add(x, y, out=z)`` reaches on the same machine with the
  same threads (bytes of the variant's inputs + gradient, divided by the measured bandwidth;
  the fastest of 5 probes per repeat, as a floor should be).
  No implementation of these formulas can beat it; a fused single-pass kernel approaches it.

Before timing, relax and loop are checked to agree (loss, gradient) on a small batch for
every variant, so the loop is a fair stand-in and not a strawman.

Times are CPU seconds of the benchmark process (``time.process_time``, one torch thread),
medians of alternated repeats.

Sizes: 64 k, 1 M and 8 M padded tokens (T = 1024 positions, B = 64 / 1024 / 8192 samples,
groups of 8, lengths uniform in [T/2, T], 2 % unscored samples).  Throughput counts the
padded B·T tokens.  The loop at 8 M is run for grpo only, once (it is linear in the number
of samples; ``--loop-8m`` runs it for every variant).

Then M2PO's band solver from n = 1 k to 8 M harmful tokens (:func:`estimators.solver_scaling`).

Run:  .venv/bin/python benchmarks/algorithm.py [--threads 1] [--smoke] [--loop-8m]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import estimators as group_bench  # noqa: E402  (the group-estimator engineer's loop pieces)

from relax_core.config import RunConfig  # noqa: E402
from relax_core.contracts import AdvantageInput, ForwardOutput, TrainBatch  # noqa: E402
from relax_core.loss import ActorLoss, LossSettings  # noqa: E402
from relax_core.plugins import default_registry  # noqa: E402

ESTIMATORS = ("grpo", "rloo", "cispo", "gspo", "sapo", "m2po", "ppo", "reinforce_plus_plus",
              "reinforce_plus_plus_baseline")
#: (estimator, corrections) pairs timed: every estimator alone, and grpo under each correction.
VARIANTS = [(e, ()) for e in ESTIMATORS] + [("grpo", ("tis",)), ("grpo", ("icepop",))]
TOKEN_MEAN = {"rloo", "cispo"}  # their capabilities require --calculate-per-token-loss
EPS, EPS_HIGH = 0.2, 0.28
KL_COEF = 0.01  # REINFORCE++: KL-shaped rewards exercised (needs old and ref log-probs)
TIS_LOW, TIS_HIGH, ICE_LOW, ICE_HIGH = 0.0, 2.0, 0.5, 2.0
SIZES = {"64k": 64, "1M": 1024, "8M": 8192}  # samples B at T = 1024
T_LEN = 1024


def label(est: str, corr: tuple[str, ...]) -> str:
    return est + "".join(f"+{c}" for c in corr)


# --------------------------------------------------------------------------- inputs


def make_batch(B: int, T: int, group: int = 8, seed: int = 0) -> dict[str, torch.Tensor]:
    """Rollout-like tensors: prefix masks, binary rewards with 2 % NaN, log-probs in [−3, 0]
    with the current policy 0.3 nats away from the old one and the engine 0.1 away."""
    b = group_bench.make_batch(B, T, group, seed)
    g = torch.Generator().manual_seed(seed + 1)
    b["rollout"] = b["old"] + 0.1 * torch.randn(B, T, generator=g)
    b["ref"] = b["old"] + 0.2 * torch.randn(B, T, generator=g)
    b["values"] = torch.rand(B, T, generator=g)
    b["log_probs"].requires_grad_(True)
    return b


def input_bytes(est: str, corr: tuple[str, ...], B: int, T: int) -> int:
    """Bytes the stage must read (inputs) and write (the gradient) at least once."""
    per_token = 4 + 4 + 1 + 4  # log π_θ, log π_old, loss_mask, gradient
    per_token += 4 * bool(corr)  # rollout log-probs
    per_token += 4 * (est == "reinforce_plus_plus") + 4 * (est == "ppo")  # ref log-probs / values
    return per_token * B * T + 16 * B  # + rewards, group_index


# --------------------------------------------------------------------------- relax


class RelaxStage:
    """The trainer's path: ``compute_advantages`` then ``ActorLoss`` and backward."""

    def __init__(self, est: str, corr: tuple[str, ...]) -> None:
        reg = default_registry()
        self.cfg = RunConfig(advantage_estimator=est, eps_clip=EPS, eps_clip_high=EPS_HIGH,
                             calculate_per_token_loss=est in TOKEN_MEAN, n_samples_per_prompt=8,
                             kl_coef=KL_COEF if est == "reinforce_plus_plus" else 0.0)
        spec = reg.get("estimator", est).spec
        params = spec.default_params()
        if est == "m2po":  # a budget that binds on these inputs, as in benchmarks/estimators.py
            params = spec.params(kl2_budget=0.01, miniclip_low=0.05, miniclip_high=0.05)
        self.est = spec.build(params, self.cfg)
        self.corrections = []
        for c in corr:
            cspec = reg.get("correction", c).spec
            low, high = (TIS_LOW, TIS_HIGH) if c == "tis" else (ICE_LOW, ICE_HIGH)
            self.corrections.append(cspec.build(cspec.params(clip_low=low, clip=high), self.cfg))
        self.settings = LossSettings.from_config(self.cfg, spec.capabilities_for(params).policy_loss_kind)
        self.needs = (est == "reinforce_plus_plus", est == "ppo")

    def __call__(self, b: dict) -> tuple[torch.Tensor, torch.Tensor]:
        mask = b["mask"]
        out = self.est.compute_advantages(AdvantageInput(
            rewards=b["rewards"], group_index=b["group_index"], loss_mask=mask, old_log_probs=b["old"],
            ref_log_probs=b["ref"] if self.needs[0] else None, values=b["values"] if self.needs[1] else None,
            response_lengths=b["lengths"]))
        tensors = {"advantages": out.advantages, "old_log_probs": b["old"]}
        if self.corrections:
            tensors["rollout_log_probs"] = b["rollout"]
        tb = TrainBatch(prompt_ids=[], response_ids=mask, loss_mask=mask, tensors=tensors)
        fn = ActorLoss(self.est, self.corrections, self.settings, num_tokens=float(mask.sum()),
                       num_samples=float(mask.shape[0]), old_from_current=False)
        lp = b["log_probs"]
        lp.grad = None
        loss, _ = fn(tb, ForwardOutput(log_probs=lp))
        loss.backward()
        fn.metrics()
        return loss.detach(), lp.grad


# --------------------------------------------------------------------------- loop


def _scored(r: float) -> bool:
    return math.isfinite(r)


def loop_returns_advantages(est: str, b: dict) -> list[list[float]]:
    """Per-sample Python loops over tokens: GAE (ppo, γ = λ = 1) or KL-shaped discounted
    returns (reinforce_plus_plus, γ = 1), then (REINFORCE++ family) the global token
    normalisation; REINFORCE++-baseline centres on the inclusive group mean first."""
    rewards, lengths = b["rewards"].tolist(), b["lengths"].tolist()
    B = len(rewards)
    if est == "reinforce_plus_plus_baseline":
        per_group: dict[int, list[float]] = {}
        for i, g in enumerate(b["group_index"].tolist()):
            if _scored(rewards[i]):
                per_group.setdefault(g, []).append(rewards[i])
        seqs = []
        for i, g in enumerate(b["group_index"].tolist()):
            vals = per_group.get(g, [])
            if not _scored(rewards[i]):
                seqs.append(None)
                continue
            flat = len(vals) < 2 or max(vals) == min(vals)
            seqs.append([0.0 if flat else rewards[i] - sum(vals) / len(vals)] * lengths[i])
    else:
        seqs = []
        old, ref, values = b["old"], b["ref"], b["values"]
        for i in range(B):
            n, r = lengths[i], rewards[i]
            if not _scored(r):
                seqs.append(None)
                continue
            if est == "ppo":
                v = values[i, :n].tolist()
                out, last = [0.0] * n, 0.0
                for t in reversed(range(n)):
                    v_next = v[t + 1] if t + 1 < n else 0.0
                    delta = (r if t == n - 1 else 0.0) + v_next - v[t]
                    last = delta + last
                    out[t] = last
                seqs.append(out)
            else:  # reinforce_plus_plus
                kl = (old[i, :n] - ref[i, :n]).tolist()
                out, run = [0.0] * n, 0.0
                for t in reversed(range(n)):
                    run = -KL_COEF * kl[t] + (r if t == n - 1 else 0.0) + run
                    out[t] = run
                seqs.append(out)
    if est == "ppo":
        return [s if s is not None else [0.0] * lengths[i] for i, s in enumerate(seqs)]
    flat = torch.tensor([x for s in seqs if s is not None for x in s], dtype=torch.float64)
    mu, var = flat.mean().item(), flat.var(unbiased=False).item()
    scale = 1.0 / math.sqrt(max(var, 1e-8))
    return [[(x - mu) * scale for x in s] if s is not None else [0.0] * lengths[i] for i, s in enumerate(seqs)]


def loop_stage(est: str, corr: tuple[str, ...], b: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The same stage one sample at a time (see the module docstring)."""
    lengths = b["lengths"].tolist()
    B = len(lengths)
    if est in ("ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        adv_tok = [torch.tensor(a) for a in loop_returns_advantages(est, b)]
    else:
        adv = group_bench.loop_advantages(est, b["rewards"], b["group_index"])
        adv_tok = [torch.full((lengths[i],), adv[i].item()) for i in range(B)]
    lp_full = b["log_probs"]
    lp_full.grad = None
    # one tensor per sample, as a per-sample forward would give them (unbind: its backward
    # stacks the rows once; indexing lp_full[i] would build a full [B, T] gradient per sample)
    lp_rows, old_rows = lp_full.unbind(0), b["old"].unbind(0)
    if est == "m2po":
        el, eh = group_bench._m2po_band([lp_rows[i][: lengths[i]] for i in range(B)],
                                        [old_rows[i][: lengths[i]] for i in range(B)], adv_tok,
                                        budget=0.01, floor=0.05)
    n_tokens = sum(lengths)
    total = torch.zeros(())
    clip_sum, kl_sum = torch.zeros(()), torch.zeros(())
    for i in range(B):
        n = lengths[i]
        if n == 0:
            continue
        lp, old, a = lp_rows[i][:n], old_rows[i][:n], adv_tok[i]
        log_ratio = lp - old
        if est in ("grpo", "m2po", "ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"):
            r = torch.exp(log_ratio)
            lo, hi = (1 - el, 1 + eh) if est == "m2po" else (1 - EPS, 1 + EPS_HIGH)
            tok = torch.max(-a * r, -a * torch.clamp(r, lo, hi))
            clipped = ((a > 0) & (r > hi)) | ((a < 0) & (r < lo))
        elif est == "rloo":
            tok = -a * lp
            clipped = torch.zeros(n, dtype=torch.bool)
        elif est == "cispo":
            r = torch.exp(log_ratio.detach())
            tok = -torch.clamp(r, 1 - EPS, 1 + EPS_HIGH) * a * lp
            clipped = ((a > 0) & (r > 1 + EPS_HIGH)) | ((a < 0) & (r < 1 - EPS))
        elif est == "gspo":
            s = torch.exp(log_ratio.mean())
            tok = torch.max(-a * s, -a * torch.clamp(s, 1 - EPS, 1 + EPS_HIGH))
            clipped = ((a > 0) & (s > 1 + EPS_HIGH)) | ((a < 0) & (s < 1 - EPS))
        elif est == "sapo":
            r = torch.exp(log_ratio)
            tau = 1.0 if a[0].item() > 0 else 1.05
            tok = -(4 / tau) * torch.sigmoid(tau * (r - 1)) * a
            clipped = torch.zeros(n, dtype=torch.bool)
        for c in corr:
            rho = torch.exp(old - b["rollout"][i, :n])
            w = torch.clamp(rho, TIS_LOW, TIS_HIGH) if c == "tis" else rho * ((rho >= ICE_LOW) & (rho <= ICE_HIGH))
            tok = tok * w
        total = total + (tok.sum() / n_tokens if est in TOKEN_MEAN else tok.mean() / B)
        clip_sum = clip_sum + clipped.sum()
        kl_sum = kl_sum - log_ratio.detach().sum()
    total.backward()
    _ = (clip_sum / n_tokens).item(), (kl_sum / n_tokens).item()  # the metrics, as the peers log them
    return total.detach(), lp_full.grad


# --------------------------------------------------------------------------- lean reference


def lean_grpo_stage(b: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """grpo's stage written as one function with as few passes over ``[B, T]`` as eager
    PyTorch allows (a reference for what the plugin path could cost, not a product path):
    the masked inputs are selected once, the mask then enters as a multiply; the metrics are
    summed from booleans.  Same loss, gradient and metrics as :class:`RelaxStage` ('grpo')."""
    from relax_core.numerics import group_advantages

    mask, lp = b["mask"], b["log_probs"]
    lp.grad = None
    A = group_advantages(b["rewards"], b["group_index"], baseline="mean",
                         std_normalization=True).advantages[:, None]  # [B, 1]
    lo, hi = 1 - EPS, 1 + EPS_HIGH
    log_ratio = torch.where(mask, lp - b["old"], 0.0).clamp(-20.0, 20.0)  # [B, T], 0 where masked
    ratio = log_ratio.exp()
    tok = torch.maximum(-A * ratio, -A * ratio.clamp(lo, hi))  # [B, T], finite everywhere
    n = mask.sum(-1)  # [B]
    loss = ((tok * mask).sum(-1) / n.clamp(min=1)).mean()
    loss.backward()
    with torch.no_grad():
        total = n.sum().clamp(min=1)
        clipped = (((A > 0) & (ratio > hi)) | ((A < 0) & (ratio < lo))) & mask
        _ = float(clipped.sum() / total), float(-log_ratio.sum() / total)  # pg_clipfrac, ppo_kl
    return loss.detach(), lp.grad


# --------------------------------------------------------------------------- floor


def bandwidth_probe(B: int, T: int) -> tuple[callable, int]:
    """An elementwise op reading two ``[B, T]`` float32 tensors and writing one."""
    x, y, z = torch.rand(B, T), torch.rand(B, T), torch.empty(B, T)
    return (lambda: torch.add(x, y, out=z)), 12 * B * T


# --------------------------------------------------------------------------- timing


def _time(fn) -> float:
    """CPU seconds of this process for one call.  Single-threaded on a shared machine, CPU
    time is the cost of the work itself; wall time would add the time spent waiting for a
    core, which depends on the other jobs (and would favour the sub-millisecond floor probe,
    which fits in one scheduler slice, over the longer stages, which do not)."""
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def check_agreement() -> None:
    b = make_batch(48, 40, seed=1)
    for est, corr in VARIANTS:
        lv, gv = RelaxStage(est, corr)(b)
        gv = gv.clone()
        ll, gl = loop_stage(est, corr, b)
        name = label(est, corr)
        torch.testing.assert_close(lv, ll, atol=1e-5, rtol=1e-5, msg=f"{name}: loss differs")
        torch.testing.assert_close(gv, torch.where(b["mask"], gl, 0.0), atol=1e-6, rtol=1e-4,
                                   msg=f"{name}: gradient differs")
    lv, gv = RelaxStage("grpo", ())(b)
    gv = gv.clone()
    ll, gl = lean_grpo_stage(b)
    torch.testing.assert_close(lv, ll, atol=1e-6, rtol=1e-5, msg="lean grpo: loss differs")
    torch.testing.assert_close(gv, gl, atol=1e-7, rtol=1e-5, msg="lean grpo: gradient differs")
    print(f"agreement (B=48, T=40): relax and loop give the same loss and gradient for "
          f"{', '.join(label(*v) for v in VARIANTS)}; so does the lean grpo reference")


def run_size(name: str, B: int, repeats: int, loop_repeats: int, loop_variants: set[str]) -> list[dict]:
    b = make_batch(B, T_LEN)
    tokens = B * T_LEN
    probe, probe_bytes = bandwidth_probe(B, T_LEN)
    probe()  # warm-up
    print(f"\n{name} tokens: B={B} × T={T_LEN} = {tokens:,} padded ({int(b['mask'].sum()):,} valid), groups of 8; "
          f"median of {repeats} (relax, floor) / {loop_repeats} (loop) alternated runs")
    print(f"{'variant':<30}{'relax tok/s':>14}{'loop tok/s':>13}{'floor tok/s':>14}"
          f"{'relax/loop':>12}{'relax/floor':>13}")
    rows = []
    for est, corr in VARIANTS:
        lab = label(est, corr)
        stage = RelaxStage(est, corr)
        stage(b)  # warm-up (allocator, lazy imports)
        do_loop = lab in loop_variants
        tr, tl, tp = [], [], []
        for k in range(repeats):
            tr.append(_time(lambda: stage(b)))
            tp.append(min(_time(probe) for _ in range(5)))
            if do_loop and k < loop_repeats:
                tl.append(_time(lambda: loop_stage(est, corr, b)))
        r, p = statistics.median(tr), min(tp)
        floor = p * input_bytes(est, corr, B, T_LEN) / probe_bytes
        lo = statistics.median(tl) if tl else math.nan
        row = dict(size=name, variant=lab, tokens=tokens, relax_s=r, loop_s=lo, floor_s=floor,
                   bandwidth_gbs=probe_bytes / p / 1e9)
        rows.append(row)
        loop_col = f"{tokens / lo:>13,.0f}" if tl else f"{'-':>13}"
        ratio_col = f"{lo / r:>11.1f}x" if tl else f"{'-':>12}"
        print(f"{lab:<30}{tokens / r:>14,.0f}{loop_col}{tokens / floor:>14,.0f}{ratio_col}{r / floor:>12.1f}x")
    tn = []
    for _ in range(repeats):
        tn.append(_time(lambda: lean_grpo_stage(b)))
    lean = statistics.median(tn)
    grpo = rows[0]
    rows.append(dict(size=name, variant="grpo, lean reference", tokens=tokens, relax_s=lean, loop_s=grpo["loop_s"],
                     floor_s=grpo["floor_s"], bandwidth_gbs=grpo["bandwidth_gbs"]))
    loop_col = f"{tokens / grpo['loop_s']:>13,.0f}" if math.isfinite(grpo["loop_s"]) else f"{'-':>13}"
    ratio_col = f"{grpo['loop_s'] / lean:>11.1f}x" if math.isfinite(grpo["loop_s"]) else f"{'-':>12}"
    print(f"{'grpo, lean reference':<30}{tokens / lean:>14,.0f}{loop_col}{tokens / grpo['floor_s']:>14,.0f}"
          f"{ratio_col}{lean / grpo['floor_s']:>12.1f}x")
    print(f"(floor: measured elementwise bandwidth {statistics.median(x['bandwidth_gbs'] for x in rows):.1f} GB/s; "
          f"relax/loop = speed-up over the loop, relax/floor = how many times the floor Relax takes)")
    return rows


def compile_demo(B: int = 1024, repeats: int = 3) -> None:
    """What fusion buys: grpo's per-token loss + reduction + metrics (the part after the
    advantages) eager vs ``torch.compile`` (inductor, CPU), same inputs, alternated."""
    from relax_core.numerics import reduce_loss
    from relax_core.policy import ppo_clip_loss

    b = make_batch(B, T_LEN)
    mask, old, lp = b["mask"], b["old"], b["log_probs"]
    adv = torch.randn(B, generator=torch.Generator().manual_seed(0))[:, None].expand(B, T_LEN).contiguous()

    def loss_and_metrics(x):
        out = ppo_clip_loss(x, old, adv, mask, EPS, EPS_HIGH)
        return (reduce_loss(out.loss, mask, "seq-mean-token-mean"),
                [reduce_loss(v.detach(), mask, "token-mean") for v in out.token_metrics.values()])

    def run(f):
        lp.grad = None
        loss, metrics = f(lp)
        loss.backward()
        return [float(m) for m in metrics]

    compiled = torch.compile(loss_and_metrics)
    t0 = time.perf_counter()
    run(compiled)
    t_compile = time.perf_counter() - t0
    probe, probe_bytes = bandwidth_probe(B, T_LEN)
    probe()
    te, tc, tp = [], [], []
    for _ in range(repeats):
        te.append(_time(lambda: run(loss_and_metrics)))
        tc.append(_time(lambda: run(compiled)))
        tp.append(min(_time(probe) for _ in range(5)))
    floor = min(tp) * input_bytes("grpo", (), B, T_LEN) / probe_bytes
    e, c = statistics.median(te), statistics.median(tc)
    print(f"\nfusion demo (grpo policy loss + reduction + metrics, forward + backward, {B * T_LEN:,} tokens): "
          f"eager {e * 1e3:.1f} ms, torch.compile {c * 1e3:.1f} ms ({e / c:.1f}x faster; compile took {t_compile:.0f} s); "
          f"floor {floor * 1e3:.2f} ms: eager {e / floor:.0f}x, compiled {c / floor:.0f}x the floor")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat (checks the script runs)")
    ap.add_argument("--loop-8m", action="store_true", help="run the loop at 8 M tokens for every variant (slow)")
    ap.add_argument("--compile-demo", action="store_true",
                    help="also time grpo's loss eager vs torch.compile at 1 M tokens (compiling takes a minute or more)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"algorithm stage: torch {torch.__version__}, python {platform.python_version()}, {platform.machine()}, "
          f"{os.cpu_count()} cores, {a.threads} thread(s), load average {load}")
    check_agreement()
    everything = {label(*v) for v in VARIANTS}
    if a.smoke:
        run_size("smoke", 16, 1, 1, everything)
        group_bench.solver_scaling([1_000, 4_000], repeats=1)
        return
    run_size("64k", SIZES["64k"], 5, 3, everything)
    run_size("1M", SIZES["1M"], 3, 2, everything)
    run_size("8M", SIZES["8M"], 2, 1, everything if a.loop_8m else {"grpo"})
    group_bench.solver_scaling([1_000, 4_000, 16_000, 64_000, 256_000, 1_000_000, 4_000_000, 8_000_000], repeats=2)
    if a.compile_demo:
        compile_demo()


if __name__ == "__main__":
    main()
