"""Throughput of the group-family estimators (grpo, rloo, cispo, gspo, sapo, m2po) against a
straightforward per-group / per-sample Python-loop implementation of the same formulas.

For each estimator, one step at about 1 M tokens (B = 1024 samples × T = 1024 padded
positions, groups of 8, response lengths uniform in [T/2, T]): advantages from the rewards,
then the policy loss forward, the run's reduction, and backward.  Both implementations are
first checked to agree (loss, gradient, advantages) on a small case; then each is timed in
the same process and the ratio is printed.  Throughput counts the padded B·T tokens.

Then M2PO's band solver on n = 1k … 8M harmful tokens: time / (n log2 n) should stay
roughly flat (the solver is a sort plus prefix sums).

Then the advantage-stage hot paths (``--hot-paths``, also part of the default run): CPU time
per stage at B = 1280 × T = 1024 (1.3 M padded tokens, prefix masks of lengths in [T/2, T]):
ppo's GAE, reinforce_plus_plus's shaped returns (each at the default γ = λ = 1 and at γ = 0.99,
λ = 0.95, and on a mask with holes), m2po's policy loss forward + backward and its solver alone.

Run:  .venv/bin/python benchmarks/estimators.py [--threads 1] [--quick | --smoke | --hot-paths]
Results of one run are kept in benchmarks/results/estimators.txt.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import platform
import statistics
import time

import torch

from relax_core import PPOClipParams
from relax_core.config import RunConfig
from relax_core.contracts import AdvantageInput, PolicyLossInput
from relax_core.host.plugins import default_registry
from relax_core.numerics import reduce_loss

ESTIMATORS = ("grpo", "rloo", "cispo", "gspo", "sapo", "m2po")
REDUCTION = {"rloo": "token-mean", "cispo": "token-mean"}  # as their capabilities require
EPS, EPS_HIGH, STD_EPS, TOL = 0.2, 0.28, 1e-6, 1e-12


# --------------------------------------------------------------------------- batch


def make_batch(B: int, T: int, group: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    rewards = torch.randint(0, 2, (B,), generator=g).float()
    rewards[torch.rand(B, generator=g) < 0.02] = float("nan")  # a few unscored samples
    group_index = torch.arange(B) // group
    old = -torch.rand(B, T, generator=g) * 3
    log_probs = old + 0.3 * torch.randn(B, T, generator=g)
    return dict(lengths=lengths, mask=mask, rewards=rewards, group_index=group_index, old=old, log_probs=log_probs)


def build(name: str):
    spec = default_registry().get("estimator", name).spec
    params = spec.default_params()
    if isinstance(params, PPOClipParams):
        params = dataclasses.replace(params, eps_clip=EPS, eps_clip_high=EPS_HIGH)
    if name == "m2po":
        params = spec.params(kl2_budget=0.01, miniclip_low=0.05, miniclip_high=0.05)  # let the band bind
    cfg = RunConfig(calculate_per_token_loss=name in REDUCTION,
                    n_samples_per_prompt=8)
    return spec.build(params, cfg)


def vectorised_step(name, est, b):
    """One step with the plugin: advantages, loss, reduction, backward."""
    adv = est.compute_advantages(AdvantageInput(rewards=b["rewards"], group_index=b["group_index"], loss_mask=b["mask"]))
    lp = b["log_probs"].clone().requires_grad_(True)
    out = est.policy_loss(PolicyLossInput(log_probs=lp, old_log_probs=b["old"], advantages=adv.advantages, loss_mask=b["mask"]))
    loss = reduce_loss(out.loss, b["mask"], REDUCTION.get(name, "seq-mean-token-mean"))
    loss.backward()
    return loss.detach(), lp.grad, adv.advantages


# --------------------------------------------------------------------------- loop reference


def loop_advantages(name, rewards, group_index):
    """Per-group loop (group mean / std / leave-one-out), per sample inside the group."""
    adv = torch.zeros_like(rewards)
    if name == "m2po":
        for i in range(len(rewards)):
            r = rewards[i].item()
            adv[i] = r if math.isfinite(r) else 0.0
        return adv
    for gid in torch.unique(group_index).tolist():
        idx = (group_index == gid).nonzero().flatten().tolist()
        scored = [i for i in idx if math.isfinite(rewards[i].item())]
        vals = torch.tensor([rewards[i].item() for i in scored], dtype=torch.float64)
        if len(scored) < 2 or vals.std().item() <= 1e-6:
            continue
        mean, std = vals.mean().item(), vals.std().item()
        for i in scored:
            r = rewards[i].item()
            if name == "rloo":
                adv[i] = r - (vals.sum().item() - r) / (len(scored) - 1)
            else:
                adv[i] = (r - mean) / (std + STD_EPS)
    return adv


def _m2po_band(lps, olds, advs, budget=0.01, floor=0.05):
    """M2PO band from a Python list of harmful δ² and a Python loop over the sorted values."""
    d = []
    for lp, old, a in zip(lps, olds, advs):
        x = (lp.detach() - old).double()
        harmful = ((a > TOL) & (x > TOL)) | ((a < -TOL) & (x < -TOL))
        d.extend((x[harmful] ** 2).tolist())
    n = len(d)
    if n == 0 or sum(d) / n <= budget + TOL:
        return 1.0, 1e5 - 1
    v = sorted(d)
    S, csum, tau = budget * n, 0.0, math.inf
    if S <= TOL:
        tau = 0.0
    else:
        for k in range(n):
            csum += v[k]
            if (v[k] - TOL) * (n - k - 1) + csum >= S - TOL:
                tau = 0.0 if k == 0 else math.sqrt(max(v[k - 1] - TOL, 0.0))
                break
    if math.isinf(tau):
        return 1.0, 1e5 - 1
    return max(1 - math.exp(-tau), floor), max(math.exp(tau) - 1, floor)


def loop_step(name, b):
    """The same step, one sample at a time (per-sample token slices, Python accumulation)."""
    adv = loop_advantages(name, b["rewards"], b["group_index"])
    lp_full = b["log_probs"].clone().requires_grad_(True)
    B = len(adv)
    rows = lp_full.unbind(0)  # per-sample tensors: indexing lp_full[i] would make the backward quadratic in B
    lps = [rows[i][: b["lengths"][i]] for i in range(B)]
    olds = [b["old"][i, : b["lengths"][i]] for i in range(B)]
    advs = [torch.full_like(olds[i], adv[i].item()) for i in range(B)]
    if name == "m2po":
        el, eh = _m2po_band(lps, olds, advs)
    total, n_tokens = 0.0, int(b["lengths"].sum())
    for i in range(B):
        lp, old, a = lps[i], olds[i], advs[i]
        n = len(lp)
        if n == 0:
            continue
        if name in ("grpo", "m2po"):
            r = torch.exp(lp - old)
            lo, hi = (1 - EPS, 1 + EPS_HIGH) if name == "grpo" else (1 - el, 1 + eh)
            tok = torch.max(-a * r, -a * torch.clamp(r, lo, hi))
        elif name == "rloo":
            tok = -a * lp
        elif name == "cispo":
            w = torch.clamp(torch.exp(lp - old), 1 - EPS, 1 + EPS_HIGH).detach()
            tok = -w * a * lp
        elif name == "gspo":
            s = torch.exp((lp - old).mean())
            tok = torch.max(-a * s, -a * torch.clamp(s, 1 - EPS, 1 + EPS_HIGH))
        elif name == "sapo":
            r = torch.exp(lp - old)
            tau = 1.0 if a[0].item() > 0 else 1.05
            tok = -(4 / tau) * torch.sigmoid(tau * (r - 1)) * a
        if name in REDUCTION:
            total = total + tok.sum() / n_tokens
        else:
            total = total + tok.mean() / B
    total.backward()
    adv_tok = torch.zeros_like(b["old"])
    for i in range(B):
        adv_tok[i, : b["lengths"][i]] = adv[i]
    return total.detach(), lp_full.grad, adv_tok


# --------------------------------------------------------------------------- timing


def timed(fn, repeats):
    """Median CPU time (``time.process_time``) of ``repeats`` calls after one untimed warm-up
    call.  CPU time, not wall: on the shared machine wall time includes waiting for a core."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def check_agreement():
    b = make_batch(48, 40, 8, seed=1)
    for name in ESTIMATORS:
        lv, gv, av = vectorised_step(name, build(name), b)
        ll, gl, al = loop_step(name, b)
        torch.testing.assert_close(av, al, atol=1e-5, rtol=1e-5, msg=f"{name}: advantages differ")
        torch.testing.assert_close(lv, ll, atol=1e-5, rtol=1e-5, msg=f"{name}: loss differs")
        torch.testing.assert_close(gv, torch.where(b["mask"], gl, 0.0), atol=1e-6, rtol=1e-4, msg=f"{name}: gradient differs")
    print("agreement check (B=48, T=40, groups of 8): advantages, loss and gradient match for "
          + ", ".join(ESTIMATORS))


def throughput(B, T, group, repeats):
    b = make_batch(B, T, group)
    tokens = B * T
    print(f"\nadvantages + policy loss forward + backward, B={B}, T={T} ({tokens / 1e6:.2f} M tokens, "
          f"{int(b['mask'].sum()) / 1e6:.2f} M valid), groups of {group}")
    print(f"{'estimator':<10}{'vectorised tok/s':>18}{'loop tok/s':>14}{'speed-up':>10}")
    for name in ESTIMATORS:
        est = build(name)
        tv = timed(lambda: vectorised_step(name, est, b), repeats)
        tl = timed(lambda: loop_step(name, b), 2)
        print(f"{name:<10}{tokens / tv:>18,.0f}{tokens / tl:>14,.0f}{tl / tv:>9.1f}x")


def solver_scaling(sizes, repeats=3):
    """Time M2PO's band solver at each n; print ns / (n log2 n) and the fitted exponent k of
    time ∝ n^k over n ≥ 64k (O(n log n) gives k slightly above 1; O(n²) would give 2)."""
    from relax_m2po.m2po import solve_bounds

    print("\nM2PO band solver (float64 sort + prefix sums), δ² ~ (0.3·N(0,1))², budget = mean/4")
    print(f"{'n':>10}{'time (ms)':>12}{'ns / (n log2 n)':>18}")
    g = torch.Generator().manual_seed(0)
    rows = []
    for n in sizes:
        d = (torch.randn(n, generator=g, dtype=torch.float64) * 0.3) ** 2
        budget = float(d.mean()) / 4
        t = timed(lambda: solve_bounds(d, budget, 0.05, 0.05), repeats)
        rows.append((n, t))
        print(f"{n:>10,}{t * 1e3:>12.2f}{t * 1e9 / (n * math.log2(n)):>18.3f}")
    big = [(math.log(n), math.log(t)) for n, t in rows if n >= 64_000]
    if len(big) >= 2:
        mx, my = statistics.fmean(x for x, _ in big), statistics.fmean(y for _, y in big)
        k = sum((x - mx) * (y - my) for x, y in big) / sum((x - mx) ** 2 for x, _ in big)
        print(f"fitted exponent over n >= 64k: time ∝ n^{k:.2f}")
    return rows


def hot_paths(B, T, repeats):
    """Median CPU ms of each advantage-stage hot path (module docstring) on one batch."""
    from relax_m2po.m2po import harmful_delta_sq, solve_bounds

    b = make_batch(B, T, 8)
    g = torch.Generator().manual_seed(2)
    values, ref = torch.rand(B, T, generator=g), b["old"] + 0.2 * torch.randn(B, T, generator=g)
    holes = b["mask"] & (torch.rand(B, T, generator=g) > 0.05)  # 5 % of the valid tokens masked out

    def estimator(name, **kw):
        spec = default_registry().get("estimator", name).spec
        cfg = RunConfig(kl_coef=0.01 if name == "reinforce_plus_plus" else 0.0)
        return spec.build(spec.params(**kw) if kw else spec.default_params(), cfg)

    def advantages(est, mask):
        inp = AdvantageInput(rewards=b["rewards"], group_index=b["group_index"], loss_mask=mask,
                             old_log_probs=b["old"], ref_log_probs=ref, values=values)
        return lambda: est.compute_advantages(inp)

    m2po = build("m2po")
    adv = b["rewards"].nan_to_num()[:, None].expand(B, T)  # m2po's advantages: the raw rewards

    def m2po_loss():
        lp = b["log_probs"].clone().requires_grad_(True)
        out = m2po.policy_loss(PolicyLossInput(log_probs=lp, old_log_probs=b["old"], advantages=adv, loss_mask=b["mask"]))
        reduce_loss(out.loss, b["mask"], "seq-mean-token-mean").backward()

    d2 = harmful_delta_sq(b["log_probs"] - b["old"], adv, b["mask"]).reshape(-1)  # what the loss hands the solver
    stages = {
        "ppo advantages, γ = λ = 1": advantages(estimator("ppo"), b["mask"]),
        "ppo advantages, γ = 0.99, λ = 0.95": advantages(estimator("ppo", gamma=0.99, lambd=0.95), b["mask"]),
        "ppo advantages, γ = 0.99, λ = 0.95, holes": advantages(estimator("ppo", gamma=0.99, lambd=0.95), holes),
        "reinforce_plus_plus advantages, γ = 1": advantages(estimator("reinforce_plus_plus"), b["mask"]),
        "reinforce_plus_plus advantages, γ = 0.99": advantages(estimator("reinforce_plus_plus", gamma=0.99), b["mask"]),
        "reinforce_plus_plus advantages, γ = 0.99, holes": advantages(estimator("reinforce_plus_plus", gamma=0.99), holes),
        "m2po policy loss forward + backward": m2po_loss,
        "m2po solver alone": lambda: solve_bounds(d2, 0.01, 0.05, 0.05),
    }
    print(f"\nadvantage-stage hot paths, B={B}, T={T} ({B * T / 1e6:.2f} M tokens, {int(b['mask'].sum()) / 1e6:.2f} M valid); "
          f"median CPU ms of {repeats}")
    for label, fn in stages.items():
        print(f"{label:<52}{timed(fn, repeats) * 1e3:>10.1f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--quick", action="store_true", help="B=128 and solver sizes up to 1M")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (checks the script runs)")
    ap.add_argument("--hot-paths", action="store_true", help="only the advantage-stage hot paths")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} cores, {a.threads} thread(s), "
          f"load average {load} (a shared machine: absolute figures are noisy; each ratio is measured side by side)")
    if a.hot_paths:
        hot_paths(1280, 1024, repeats=5)
        return
    check_agreement()
    if a.smoke:
        throughput(16, 64, 8, repeats=1)
        hot_paths(16, 64, repeats=1)
        solver_scaling([1_000, 4_000], repeats=1)
        return
    throughput(128 if a.quick else 1024, 1024, 8, repeats=3)
    hot_paths(128 if a.quick else 1280, 1024, repeats=5)
    sizes = [1_000, 4_000, 16_000, 64_000, 256_000, 1_000_000] + ([] if a.quick else [4_000_000, 8_000_000])
    solver_scaling(sizes)


if __name__ == "__main__":
    main()
