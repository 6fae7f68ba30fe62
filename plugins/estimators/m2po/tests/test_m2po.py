"""relax-m2po: harmful set, second moment, water-filling solver (values pinned by issue 3 and
the solver's boundary cases), loss and gradient, masking, dtypes, stat scope, capabilities."""

import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from relax_core.config import RunConfig, build_config
from relax_core.contracts import AdvantageInput, PolicyLossInput
from relax_core.host.plugins import default_registry
from relax_core.host.validation import resolve
from relax_m2po.m2po import harmful_delta_sq, m2po_loss, solve_bounds, sort_ascending

TOL = 1e-12


def _spec():
    return default_registry().get("estimator", "m2po").spec


def _build(**params):
    spec = _spec()
    return spec.build(spec.params(**params), RunConfig())


def _inp(ppo_kl, A, mask=None, dtype=torch.float32):
    old = torch.full((1, len(ppo_kl)), -2.0, dtype=torch.float64)
    lp = (old - torch.tensor([ppo_kl], dtype=torch.float64)).to(dtype).requires_grad_(True)
    A = torch.tensor([A], dtype=dtype).expand(1, len(ppo_kl)) if not isinstance(A, list) else torch.tensor([A], dtype=dtype)
    m = torch.ones(1, len(ppo_kl), dtype=torch.bool) if mask is None else torch.tensor([mask])
    return PolicyLossInput(log_probs=lp, old_log_probs=old.to(dtype), advantages=A, loss_mask=m)


def _scalars(out):
    return {k: float(v) for k, v in out.scalar_metrics.items()}


def test_mixed_signs_from_issue():
    out = _build(kl2_budget=0.02).policy_loss(_inp([-0.8, -0.4, -0.1, 0.2, 0.7], [1.0, 1.0, -1.0, -1.0, -1.0]))
    s = _scalars(out)
    assert s["ppo_kl_m2_before"] == pytest.approx(0.3325)  # harmful 0, 1, 3, 4: (0.64+0.16+0.04+0.49)/4
    assert s["ppo_kl_m2_after"] == pytest.approx(0.3325)  # k = 0: the uncapped mean
    assert (s["m2po_eps_low"], s["m2po_eps_high"]) == pytest.approx((0.3, 0.5))  # τ = 0: the floors


def test_exact_breakpoint_from_issue():
    out = _build(kl2_budget=1.0).policy_loss(_inp([-1.0, -2.0, -3.0], 1.0))
    s = _scalars(out)
    assert s["ppo_kl_m2_before"] == pytest.approx(14 / 3)
    assert s["ppo_kl_m2_after"] == pytest.approx(1.0)
    assert s["m2po_eps_low"] == pytest.approx(1 - math.exp(-1)) == pytest.approx(0.632121, abs=1e-6)
    assert s["m2po_eps_high"] == pytest.approx(math.e - 1) == pytest.approx(1.718282, abs=1e-6)


def test_interior_breakpoint_with_zero_floors_from_issue():
    out = _build(kl2_budget=0.02, miniclip_low=0.0, miniclip_high=0.0).policy_loss(_inp([-0.5, -0.3, -0.1, -0.05], 1.0))
    s = _scalars(out)
    assert s["ppo_kl_m2_before"] == pytest.approx(0.088125)
    assert s["ppo_kl_m2_after"] == pytest.approx(0.008125)
    assert s["m2po_eps_low"] == pytest.approx(0.095163, abs=1e-6)
    assert s["m2po_eps_high"] == pytest.approx(0.105171, abs=1e-6)
    # band [e^-0.1, e^0.1] = [0.904837, 1.105171]: r = e^0.5, e^0.3 are clipped (A > 0),
    # r = e^0.1 sits on the edge (float32), r = e^0.05 is inside
    clip = out.token_metrics["pg_clipfrac"][0].tolist()
    assert clip[:2] == [1.0, 1.0] and clip[3] == 0.0
    torch.testing.assert_close(out.loss[0, :2], torch.full((2,), -1.105171), atol=1e-5, rtol=0)


def test_within_budget_no_clipping_from_issue():
    inp = _inp([-0.05, 0.05, -0.02], [1.0, -1.0, 1.0])
    out = _build(kl2_budget=0.01).policy_loss(inp)
    s = _scalars(out)
    assert s["ppo_kl_m2_before"] == pytest.approx(0.0054 / 3, abs=1e-8)  # log r in float32
    assert s["ppo_kl_m2_after"] == s["ppo_kl_m2_before"]
    assert s["m2po_eps_low"] == 1.0 and s["m2po_eps_high"] == pytest.approx(1e5 - 1)
    assert out.token_metrics["pg_clipfrac"].sum() == 0
    r = torch.exp(torch.tensor([0.05, -0.05, 0.02]))
    torch.testing.assert_close(out.loss[0], -r * torch.tensor([1.0, -1.0, 1.0]))
    out.loss.sum().backward()
    torch.testing.assert_close(inp.log_probs.grad[0], -r * torch.tensor([1.0, -1.0, 1.0]))


@pytest.mark.parametrize("v,S,tau,after", [
    ([1, 4, 9], 0.0, 0.0, 0.0),  # zero target: τ = 0, M2_after = 0
    ([1, 4, 9], 1.0, 0.0, 14 / 3),  # k = 0: uncapped mean
    ([1, 4, 9], 3.0, 1.0, 1.0),  # exact breakpoint moves to k = 1
    ([1, 4, 9], 8.0, 1.0, 1.0),  # previous breakpoint, not the continuous level 3.5
    ([1, 4, 9], 10.0, 2.0, 3.0),  # k = 2: (1 + 4 + 4)/3
    ([1, 1, 4, 4], 4.0, 1.0, 1.0),  # repeated breakpoint
    ([0.1, 0.2, 0.4], 0.15, 0.0, 0.7 / 3),
])
def test_solver_boundary_cases(v, S, tau, after):
    d = torch.tensor(v, dtype=torch.float64)
    b = solve_bounds(d[torch.randperm(len(v))], S / len(v), 0.0, 0.0)
    assert float(b.tau) == pytest.approx(tau, abs=1e-6)
    assert float(b.m2_after) == pytest.approx(after)
    assert float(b.m2_before) == pytest.approx(sum(v) / len(v))


def test_solver_unconstrained_cases():
    for v, S in (([1, 4, 9], 14.0), ([0, 0], 0.0), ([], 0.5)):
        d = torch.tensor(v, dtype=torch.float64)
        b = solve_bounds(d, S / max(len(v), 1), 0.3, 0.5)
        assert math.isinf(float(b.tau)) and float(b.eps_low) == 1.0 and float(b.eps_high) == 1e5 - 1


def _reference_solver(values, budget):
    """Straight transcription of the spec's rules with a Python loop (the test oracle)."""
    n = len(values)
    if n == 0:
        return math.inf, 0.0
    m2 = sum(values) / n
    if m2 <= budget + TOL:
        return math.inf, m2
    v = sorted(values)
    S = budget * n
    if S >= sum(v) - TOL:
        return math.inf, m2
    if S <= TOL:
        return 0.0, 0.0
    csum = 0.0
    for k in range(n):
        csum += v[k]
        if (v[k] - TOL) * (n - k - 1) + csum >= S - TOL:
            if k == 0:
                return 0.0, m2
            return math.sqrt(max(v[k - 1] - TOL, 0.0)), (csum - v[k] + (n - k) * v[k - 1]) / n
    return math.inf, m2


def test_solver_matches_loop_reference_random():
    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 7, 31, 200):
        for frac in (0.0, 0.05, 0.3, 0.7, 1.0, 1.1):
            vals = (torch.randn(n, generator=g, dtype=torch.float64) * 0.5) ** 2
            budget = frac * float(vals.mean())
            # non-harmful slots (+inf) mixed in must be ignored
            d = torch.cat([vals, torch.full((5,), math.inf, dtype=torch.float64)])[torch.randperm(n + 5, generator=g)]
            b = solve_bounds(d, budget, 0.0, 0.0)
            tau, after = _reference_solver(vals.tolist(), budget)
            assert float(b.tau) == pytest.approx(tau, rel=1e-9, abs=1e-12) or (math.isinf(tau) and math.isinf(float(b.tau)))
            assert float(b.m2_after) == pytest.approx(after, rel=1e-9, abs=1e-15)


def _harmful_loop(x, A, m):
    """δ² of the harmful valid tokens, one token at a time (row-major)."""
    out = []
    for i in range(x.shape[0]):
        for t in range(x.shape[1]):
            xv, a = float(x[i, t]), float(A[i, t])
            if m[i, t] and ((a > TOL and xv > TOL) or (a < -TOL and xv < -TOL)):
                out.append(xv * xv)
    return out


def test_harmful_delta_sq_gathers_only_the_harmful_tokens():
    g = torch.Generator().manual_seed(11)
    B, T = 6, 40
    x = torch.randn(B, T, generator=g) * 0.3
    x[0, :5] = torch.tensor([1e-13, -1e-13, 0.0, 2e-12, -2e-12])  # around the 1e-12 tolerance
    A = torch.randn(B, generator=g)[:, None].expand(B, T).contiguous()
    A[1] = 0.0  # zero advantage: never harmful
    m = torch.rand(B, T, generator=g) < 0.4  # mostly masked
    m[0, :5] = True
    A[0] = 1.0
    d = harmful_delta_sq(torch.where(m, x, 1e9), torch.where(m, A, 1e9), m)  # garbage in masked slots
    ref = _harmful_loop(x, A, m)
    assert d.dtype == torch.float64 and d.shape == (len(ref),) and 0 < len(ref) < m.sum() / 2
    torch.testing.assert_close(d, torch.tensor(ref, dtype=torch.float64), rtol=0, atol=0)
    assert float(d[0]) == float(torch.tensor(2e-12)) ** 2  # 1e-13 and 0 are not harmful


@pytest.mark.parametrize("frac_masked", [0.0, 0.5, 0.95])
def test_loss_band_matches_loop_reference_with_many_non_harmful_tokens(frac_masked):
    g = torch.Generator().manual_seed(12)
    B, T = 16, 64
    old = -torch.rand(B, T, generator=g) * 2
    x = torch.randn(B, T, generator=g) * 0.3
    A = torch.randn(B, generator=g)[:, None].expand(B, T).contiguous()
    A[: B // 2] = 0.0  # half the samples have no signal: no harmful token
    m = torch.rand(B, T, generator=g) >= frac_masked
    m[1] = False
    lp = old + x
    x32 = (lp - old) * m  # the float32 log-ratio the loss sees
    vals = _harmful_loop(x32, A, m)
    assert len(vals) < m.sum() / 2 + 1
    for budget in (0.0, 0.3 * sum(vals) / max(len(vals), 1), 10.0):
        out = m2po_loss(lp, old, A, m, kl2_budget=budget, miniclip_low=0.0, miniclip_high=0.0)
        tau, after = _reference_solver(vals, budget)
        el = 1.0 if math.isinf(tau) else 1 - math.exp(-tau)
        eh = 1e5 - 1 if math.isinf(tau) else math.exp(tau) - 1
        s = _scalars(out)
        assert s["m2po_eps_low"] == pytest.approx(el, rel=1e-6, abs=1e-7)
        assert s["m2po_eps_high"] == pytest.approx(eh, rel=1e-6, abs=1e-7)
        assert s["ppo_kl_m2_after"] == pytest.approx(after, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_sort_ascending_equals_torch_sort(dtype):
    g = torch.Generator().manual_seed(14)
    for n in (0, 1, 2, 17, 5000):
        v = torch.randn(n, generator=g, dtype=torch.float64).to(dtype) ** 2
        if n > 2:
            v[: n // 3] = math.inf  # padding
            v[1] = v[n - 1]  # a tie
        out = sort_ascending(v[torch.randperm(n, generator=g)])
        assert out.dtype == dtype and torch.equal(out, torch.sort(v).values)
    assert torch.equal(sort_ascending(torch.tensor([2.0, 1.0], requires_grad=True)), torch.tensor([1.0, 2.0]))


def test_solver_ignores_inf_padding_bit_for_bit():
    g = torch.Generator().manual_seed(13)
    d = (torch.randn(500, generator=g, dtype=torch.float64) * 0.4) ** 2
    padded = torch.cat([d, torch.full((4000,), math.inf, dtype=torch.float64)])[torch.randperm(4500, generator=g)]
    for budget in (0.0, 0.01, 0.05, 1.0):
        assert [float(t) for t in solve_bounds(d, budget, 0.1, 0.1)] == [float(t) for t in solve_bounds(padded, budget, 0.1, 0.1)]


def test_gradient_matches_formula_and_mask_is_inert():
    g = torch.Generator().manual_seed(5)
    B, T = 4, 6
    old = -torch.rand(B, T, generator=g) * 2
    x = torch.randn(B, T, generator=g) * 0.4  # log r
    A = torch.randn(B, generator=g)[:, None].expand(B, T).contiguous()
    m = torch.rand(B, T, generator=g) > 0.3
    m[0] = False
    lp = (old + x).requires_grad_(True)
    out = m2po_loss(lp, old, A, m, kl2_budget=0.01, miniclip_low=0.1, miniclip_high=0.1)
    out.loss.sum().backward()
    el, eh = float(out.scalar_metrics["m2po_eps_low"]), float(out.scalar_metrics["m2po_eps_high"])
    assert el < 1.0  # the band was constrained
    r = torch.exp(x)
    free = ((A >= 0) & (r <= 1 + eh)) | ((A < 0) & (r >= 1 - el))
    torch.testing.assert_close(lp.grad, torch.where(m & free, -A * r, 0.0))
    # garbage (NaN / huge log-ratios with harmful signs) in masked slots changes nothing
    lp2 = torch.where(m, old + x, torch.full_like(x, float("nan"))).requires_grad_(True)
    out2 = m2po_loss(lp2, torch.where(m, old, -1e9), torch.where(m, A, 1e9), m,
                     kl2_budget=0.01, miniclip_low=0.1, miniclip_high=0.1)
    out2.loss.sum().backward()
    torch.testing.assert_close(out2.loss, out.loss)
    torch.testing.assert_close(lp2.grad, lp.grad)
    assert _scalars(out2) == _scalars(out)


def test_bfloat16_and_advantages_are_raw_rewards():
    inp = _inp([-1.0, -2.0, -3.0], 1.0, dtype=torch.bfloat16)
    out = _build(kl2_budget=1.0).policy_loss(inp)
    out.loss.sum().backward()
    assert out.loss.dtype == torch.float32 and inp.log_probs.grad.dtype == torch.bfloat16
    assert float(out.scalar_metrics["m2po_eps_high"]) == pytest.approx(math.e - 1, abs=0.05)
    adv = _build().compute_advantages(AdvantageInput(
        rewards=torch.tensor([1.0, float("nan"), 0.5]), group_index=torch.tensor([0, 0, 0]),
        loss_mask=torch.tensor([[True, True], [True, True], [True, False]])))
    torch.testing.assert_close(adv.advantages, torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.5, 0.0]]))


def test_capabilities_cp_refused_unless_global_scope():
    spec = _spec()
    assert not spec.capabilities_for().supports_context_parallel
    assert spec.capabilities_for(spec.params(stat_scope="global")).supports_context_parallel
    assert set(spec.capabilities_for().metrics) == {"train/ppo_kl_m2_before", "train/ppo_kl_m2_after",
                                                    "train/m2po_eps_low", "train/m2po_eps_high"}
    reg = default_registry()

    def est_problems(**cli):
        cfg = build_config(cli={"advantage_estimator": "m2po", **cli}, param_schemas=reg.param_schemas())
        return [p for p in resolve(cfg, reg)[1] if p.component.startswith("estimator")]

    probs = est_problems(context_parallel_size=2)
    assert [p.constraint for p in probs] == ["supports_context_parallel"] and "relax-m2po" in probs[0].component
    assert est_problems(context_parallel_size=2, **{"m2po.stat_scope": "global"}) == []
    assert est_problems(n_samples_per_prompt=1, rollout_batch_size=32) == []


_CP_WORKER = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    from relax_m2po.m2po import m2po_loss
    rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    g = torch.Generator().manual_seed(7)
    B, T = 3, 10
    old = -torch.rand(B, T, generator=g) * 2
    x = torch.randn(B, T, generator=g) * 0.5
    A = torch.randn(B, generator=g)[:, None].expand(B, T).contiguous()
    m = torch.arange(T)[None, :] < torch.tensor([10, 7, 3])[:, None]
    kw = dict(kl2_budget=0.01, miniclip_low=0.05, miniclip_high=0.05)
    lp = (old + x).requires_grad_(True)
    full = m2po_loss(lp, old, A, m, **kw)
    full.loss.sum().backward()
    sl = slice(0, 5) if rank == 0 else slice(5, T)  # each sequence split over 2 CP ranks
    lps = (old + x)[:, sl].clone().requires_grad_(True)
    part = m2po_loss(lps, old[:, sl], A[:, sl], m[:, sl], process_group=dist.group.WORLD, **kw)
    part.loss.sum().backward()
    torch.save({"full_loss": full.loss.detach()[:, sl], "full_grad": lp.grad[:, sl],
                "part_loss": part.loss.detach(), "part_grad": lps.grad,
                "full_s": {k: float(v) for k, v in full.scalar_metrics.items()},
                "part_s": {k: float(v) for k, v in part.scalar_metrics.items()}}, out)
    dist.destroy_process_group()
""")


def test_global_scope_is_context_parallel_invariant(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "worker.py"
    script.write_text(_CP_WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(port), str(tmp_path / f"r{r}.pt")], env=env)
             for r in range(2)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    res = [torch.load(tmp_path / f"r{r}.pt", weights_only=True) for r in range(2)]
    for r in res:
        torch.testing.assert_close(r["part_loss"], r["full_loss"])
        torch.testing.assert_close(r["part_grad"], r["full_grad"])
        assert r["part_s"] == pytest.approx(r["full_s"])
    assert res[0]["full_s"]["m2po_eps_low"] < 1.0  # the band was constrained in this case


@pytest.mark.parametrize("scope", ["local", "global"])
def test_contract(scope):
    from relax_authoring.testing import check_contract

    spec = _spec()
    check_contract(spec, spec.params(stat_scope=scope))


def test_declared_metrics_are_the_ones_reported():
    out = _build().policy_loss(_inp([-0.1, 0.2], 1.0))
    assert {f"train/{k}" for k in out.scalar_metrics} == set(_spec().capabilities_for().metrics)
