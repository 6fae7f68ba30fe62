"""``BackendCapabilities.requires``: a declared capability that holds only on CUDA or with an
extra module is refused at startup, naming what is missing, where that does not hold."""

from __future__ import annotations

from relax_core.config import RunConfig
from relax_core.host.capabilities import CAPABILITIES, Context, Selected
from relax_core.specs import BackendCapabilities

CP = next(c for c in CAPABILITIES if c.kind == "backend" and c.field == "supports_context_parallel")
PP = next(c for c in CAPABILITIES if c.kind == "backend" and c.field == "supports_pipeline_parallel")


def _check(cap, caps: BackendCapabilities, **cfg) -> str | None:
    ctx = Context(cfg=RunConfig(**cfg), estimator=None, backend=Selected("backend", "b", caps, "relax-b 0"))
    return cap.check(ctx, caps)


def test_requirements_of_a_declared_capability():
    caps = BackendCapabilities(devices=frozenset({"cpu", "cuda"}), supports_context_parallel=True,
                               supports_pipeline_parallel=True,
                               requires=frozenset({"supports_context_parallel:cuda",
                                                   "supports_context_parallel:no_such_module_relax_test"}))
    msg = _check(CP, caps, context_parallel_size=2, device="cpu")
    assert msg == ("supports context parallelism only with a CUDA device (--device cpu) and the "
                   "no_such_module_relax_test module (not installed), but --context-parallel-size is 2")
    assert _check(CP, caps, context_parallel_size=2, device="cuda") == (
        "supports context parallelism only with the no_such_module_relax_test module (not installed), "
        "but --context-parallel-size is 2")
    assert _check(CP, caps, context_parallel_size=1, device="cpu") is None  # not used: nothing required
    assert _check(PP, caps, pipeline_parallel_size=2, device="cpu") is None  # requirements are per capability
    met = BackendCapabilities(supports_context_parallel=True, requires=frozenset({"supports_context_parallel:json"}))
    assert _check(CP, met, context_parallel_size=2, device="cuda") is None
    assert _check(CP, BackendCapabilities(), context_parallel_size=2) == (
        "does not support context parallelism, but --context-parallel-size is 2")
    assert "needs" in CP.fix
