"""The algorithm stage of every estimator, side by side with a loop-style implementation and
with the machine's bandwidth floor.

One *algorithm stage* is what the trainer runs between the model's forward and backward:

    advantages (estimator.compute_advantages, on the whole batch)
    → per-token policy loss (estimator.policy_loss) → corrections (tis / icepop)
    → the run's reduction and metrics (relax_core.stages.loss.ActorLoss) → backward to log π_θ.

Three ways of doing the same work on the same tensors, alternated and repeated in one process:

- **relax**: the installed plugins through ``ActorLoss`` (exactly the trainer's code path;
  the metrics ``pg_clipfrac``, ``ppo_kl`` and the corrections' metrics included), eager
  (the default) and with ``--compile-loss`` (``ActorLoss`` built as the trainer builds it
  with the flag on: its per-token part through ``torch.compile``; the advantages stay
  eager).  The compiled side is compiled once per variant, in the agreement check, and
  reused at every size (dynamic shapes): the compile time is printed, not counted in the
  per-step figures.
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

Run:  .venv/bin/python benchmarks/algorithm.py [--threads 1] [--smoke] [--loop-8m] [--no-compile]
      [--sizes 64k,1M,8M] [--variants grpo,grpo+tis,...]
"""

from __future__ import annotations

import argparse
import dataclasses
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

from relax_core import PPOClipParams  # noqa: E402
from relax_core.batch import Batch  # noqa: E402
from relax_core.config import RunConfig  # noqa: E402
from relax_core.contracts import AdvantageInput, ForwardOutput  # noqa: E402
from relax_core.host.plugins import default_registry  # noqa: E402
from relax_core.stages.loss import ActorLoss, LossSettings  # noqa: E402

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
    """The trainer's path: ``compute_advantages`` then ``ActorLoss`` and backward (with
    ``compile_loss``: ``--compile-loss``)."""

    def __init__(self, est: str, corr: tuple[str, ...], compile_loss: bool = False) -> None:
        reg = default_registry()
        self.cfg = RunConfig(advantage_estimator=est,
                             calculate_per_token_loss=est in TOKEN_MEAN, n_samples_per_prompt=8,
                             kl_coef=KL_COEF if est == "reinforce_plus_plus" else 0.0, compile_loss=compile_loss)
        spec = reg.get("estimator", est).spec
        params = spec.default_params()
        if isinstance(params, PPOClipParams):
            params = dataclasses.replace(params, eps_clip=EPS, eps_clip_high=EPS_HIGH)
        if est == "m2po":  # a budget that binds on these inputs, as in benchmarks/estimators.py
            params = spec.params(kl2_budget=0.01, miniclip_low=0.05, miniclip_high=0.05)
        self.est = spec.build(params, self.cfg)
        self.corrections = []
        for c in corr:
            cspec = reg.get("correction", c).spec
            low, high = (TIS_LOW, TIS_HIGH) if c == "tis" else (ICE_LOW, ICE_HIGH)
            self.corrections.append(cspec.build(cspec.params(clip_low=low, clip=high), self.cfg))
        self.settings = LossSettings.from_config(self.cfg, spec.capabilities_for(params).behaviour_numerator)
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
        tb = Batch(response_ids=mask, loss_mask=mask, **tensors)
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


def build_stages(variants: list[tuple[str, tuple[str, ...]]], compiled: bool) -> dict[str, dict]:
    """Each variant's relax stages, built once: ``eager``, and ``compiled`` (``--compile-loss``)
    unless ``compiled`` is False; the compiled ones are compiled here (``compile_s``: wall
    seconds of the first call, on a small batch) and reused at every size."""
    b = make_batch(48, 40, seed=1)
    stages = {}
    for est, corr in variants:
        st = {"eager": RelaxStage(est, corr)}
        if compiled:
            st["compiled"] = RelaxStage(est, corr, compile_loss=True)
            t0 = time.perf_counter()
            st["compiled"](b)
            st["compile_s"] = time.perf_counter() - t0
        stages[label(est, corr)] = st
    return stages


def check_agreement(variants: list[tuple[str, tuple[str, ...]]], stages: dict[str, dict]) -> None:
    b = make_batch(48, 40, seed=1)
    for est, corr in variants:
        name = label(est, corr)
        lv, gv = stages[name]["eager"](b)
        gv = gv.clone()
        ll, gl = loop_stage(est, corr, b)
        torch.testing.assert_close(lv, ll, atol=1e-5, rtol=1e-5, msg=f"{name}: loss differs")
        torch.testing.assert_close(gv, torch.where(b["mask"], gl, 0.0), atol=1e-6, rtol=1e-4,
                                   msg=f"{name}: gradient differs")
        if "compiled" in stages[name]:
            lc, gc = stages[name]["compiled"](b)
            torch.testing.assert_close(lc, lv, atol=1e-7, rtol=1e-5, msg=f"{name}: compiled loss differs")
            torch.testing.assert_close(gc, gv, atol=1e-8, rtol=1e-5, msg=f"{name}: compiled gradient differs")
    lv, gv = RelaxStage("grpo", ())(b)
    gv = gv.clone()
    ll, gl = lean_grpo_stage(b)
    torch.testing.assert_close(lv, ll, atol=1e-6, rtol=1e-5, msg="lean grpo: loss differs")
    torch.testing.assert_close(gv, gl, atol=1e-7, rtol=1e-5, msg="lean grpo: gradient differs")
    compiled = [n for n in stages if "compiled" in stages[n]]
    print(f"agreement (B=48, T=40): relax and loop give the same loss and gradient for "
          f"{', '.join(label(*v) for v in variants)}; so does the lean grpo reference"
          + ("; so does relax compiled (--compile-loss)" if compiled else ""))
    if compiled:
        print("compile time (--compile-loss, once per variant, wall s, not counted below): "
              + ", ".join(f"{n} {stages[n]['compile_s']:.1f}" for n in compiled))
    else:
        print("relax compiled (--compile-loss): not measured in this run (--smoke or --no-compile)")


def run_size(name: str, B: int, repeats: int, loop_repeats: int, loop_variants: set[str],
             variants: list[tuple[str, tuple[str, ...]]], stages: dict[str, dict]) -> list[dict]:
    b = make_batch(B, T_LEN)
    tokens = B * T_LEN
    probe, probe_bytes = bandwidth_probe(B, T_LEN)
    probe()  # warm-up
    print(f"\n{name} tokens: B={B} × T={T_LEN} = {tokens:,} padded ({int(b['mask'].sum()):,} valid), groups of 8; "
          f"median of {repeats} (relax, compiled, floor) / {loop_repeats} (loop) alternated runs")
    print(f"{'variant':<30}{'relax tok/s':>13}{'compiled tok/s':>16}{'loop tok/s':>13}{'floor tok/s':>15}"
          f"{'relax/loop':>12}{'compiled/loop':>15}{'relax/floor':>13}{'compiled/floor':>16}")
    rows = []

    def col(x: float, width: int, fmt: str, unit: str = "") -> str:
        return f"{f'{x:{fmt}}{unit}' if math.isfinite(x) else '-':>{width}}"

    def line(lab: str, t: dict) -> str:
        return (f"{lab:<30}{col(tokens / t['relax_s'], 13, ',.0f')}{col(tokens / t['compiled_s'], 16, ',.0f')}"
                f"{col(tokens / t['loop_s'], 13, ',.0f')}{col(tokens / t['floor_s'], 15, ',.0f')}"
                f"{col(t['loop_s'] / t['relax_s'], 12, '.1f', 'x')}{col(t['loop_s'] / t['compiled_s'], 15, '.1f', 'x')}"
                f"{col(t['relax_s'] / t['floor_s'], 13, '.1f', 'x')}{col(t['compiled_s'] / t['floor_s'], 16, '.1f', 'x')}")

    for est, corr in variants:
        lab = label(est, corr)
        stage, compiled = stages[lab]["eager"], stages[lab].get("compiled")
        stage(b)  # warm-up (allocator, lazy imports)
        if compiled:
            compiled(b)
        do_loop = lab in loop_variants
        tr, tc, tl, tp = [], [], [], []
        for k in range(repeats):
            tr.append(_time(lambda: stage(b)))
            if compiled:
                tc.append(_time(lambda: compiled(b)))
            tp.append(min(_time(probe) for _ in range(5)))
            if do_loop and k < loop_repeats:
                tl.append(_time(lambda: loop_stage(est, corr, b)))
        p = min(tp)
        rows.append(dict(size=name, variant=lab, tokens=tokens, relax_s=statistics.median(tr),
                         compiled_s=statistics.median(tc) if tc else math.nan,
                         loop_s=statistics.median(tl) if tl else math.nan,
                         floor_s=p * input_bytes(est, corr, B, T_LEN) / probe_bytes, bandwidth_gbs=probe_bytes / p / 1e9))
        print(line(lab, rows[-1]))
    if ("grpo", ()) in variants:
        tn = []
        for _ in range(repeats):
            tn.append(_time(lambda: lean_grpo_stage(b)))
        grpo = rows[variants.index(("grpo", ()))]
        rows.append(dict(grpo, variant="grpo, lean reference", relax_s=statistics.median(tn), compiled_s=math.nan))
        print(line("grpo, lean reference", rows[-1]))
    print(f"(floor: measured elementwise bandwidth {statistics.median(x['bandwidth_gbs'] for x in rows):.1f} GB/s; "
          f"x/loop = speed-up over the loop, x/floor = how many times the floor x takes; "
          f"relax = eager (the default), compiled = --compile-loss, compile time excluded)")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes, one repeat, no compiled side (checks the script runs)")
    ap.add_argument("--loop-8m", action="store_true", help="run the loop at 8 M tokens for every variant (slow)")
    ap.add_argument("--no-compile", action="store_true",
                    help="skip the --compile-loss side (compiling takes about 10-30 s per variant)")
    ap.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated subset of {','.join(SIZES)}")
    ap.add_argument("--variants", default=None, help="comma-separated subset of "
                    f"{','.join(label(*v) for v in VARIANTS)} (default: all; the M2PO solver scaling runs "
                    "only with all of them)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    names = {label(*v): v for v in VARIANTS}
    if a.variants is not None and (unknown := set(a.variants.split(",")) - set(names)):
        ap.error(f"unknown variant(s) {', '.join(sorted(unknown))}")
    variants = VARIANTS if a.variants is None else [names[n] for n in a.variants.split(",")]
    sizes = a.sizes.split(",")
    if unknown := set(sizes) - set(SIZES):
        ap.error(f"unknown size(s) {', '.join(sorted(unknown))}; choose from {', '.join(SIZES)}")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"algorithm stage: torch {torch.__version__}, python {platform.python_version()}, {platform.machine()}, "
          f"{os.cpu_count()} cores, {a.threads} thread(s), load average {load}")
    stages = build_stages(variants, compiled=not (a.smoke or a.no_compile))
    check_agreement(variants, stages)
    everything = {label(*v) for v in variants}
    if a.smoke:
        run_size("smoke", 16, 1, 1, everything, variants, stages)
        group_bench.solver_scaling([1_000, 4_000], repeats=1)
        return
    plan = {"64k": (5, 3, everything), "1M": (3, 2, everything),
            "8M": (2, 1, everything if a.loop_8m else {"grpo"})}
    for size in sizes:
        run_size(size, SIZES[size], *plan[size], variants, stages)
    if a.variants is None:
        group_bench.solver_scaling([1_000, 4_000, 16_000, 64_000, 256_000, 1_000_000, 4_000_000, 8_000_000],
                                   repeats=2)


if __name__ == "__main__":
    main()
