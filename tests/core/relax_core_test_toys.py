"""Throwaway plugins and toy components for the core's tests (no entry points).

Imported by module name (``tests/core/conftest.py`` puts this folder on ``sys.path``) so
that toy factories resolve by dotted path, as a real plugin's do.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

from relax_core import (BackendCapabilities, BackendSpec, EngineCapabilities, EngineSpec,
                        EstimatorCapabilities, EstimatorSpec, hookimpl, param)
from relax_core.hookspecs import HOOK_KINDS

_KIND_HOOK = {kind: hook for hook, kind in HOOK_KINDS.items()}


def make_plugin(*specs, **raw_hooks) -> types.SimpleNamespace:
    """A plugin object registering ``specs`` (each under its kind's hook), plus any
    extra ``hook_name=function`` attributes (to test misspelled or undecorated hooks)."""
    by_hook: dict[str, list] = {}
    for s in specs:
        by_hook.setdefault(_KIND_HOOK[s.kind], []).append(s)
    ns = types.SimpleNamespace(**raw_hooks)
    for hook, lst in by_hook.items():
        setattr(ns, hook, hookimpl(lambda lst=tuple(lst): list(lst)))
    return ns


@dataclass(frozen=True)
class ToyParams:
    beta: float = param(0.5, "A toy coefficient.", ge=0, le=1)
    mode: str = param("a", "A toy mode.", choices=("a", "b"))


def estimator(name="toy", caps=None, **kw) -> EstimatorSpec:
    return EstimatorSpec(name=name, summary="toy estimator", source="tests",
                         factory=kw.pop("factory", "relax_core_test_toys:build_estimator"),
                         params=kw.pop("params", ToyParams), capabilities=caps, **kw)


BASE_CAPS = EstimatorCapabilities(sync_only=False, supports_fully_async=True, policy_loss_kind="ppo_clip",
                                  min_group_size=2)


def infra_plugin() -> types.SimpleNamespace:
    """The engine 'hf' and backend 'torch' a default config selects."""
    return make_plugin(
        EngineSpec(name="hf", summary="toy engine", source="tests", factory="x:y",
                   capabilities=EngineCapabilities(returns_log_probs=True, supports_weight_update=True)),
        BackendSpec(name="torch", summary="toy backend", source="tests", factory="x:y",
                    capabilities=BackendCapabilities(supports_data_parallel=True, supports_critic=True)),
    )


def build_estimator(params, config):
    return ("toy", params, config)
