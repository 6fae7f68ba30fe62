"""``check_contract``: spec-level checks and dispatch to the per-kind checks.

Spec-level checks import nothing heavy; the estimator, correction and reward checks
(:mod:`relax_authoring.testing.components`) import torch when they run.
"""

from __future__ import annotations

import dataclasses
import re
import traceback
from contextlib import contextmanager
from typing import Any, Iterator

from relax_core.config import RunConfig, check_bounds, flag_collisions, param_flag
from relax_core.host.capabilities import CAPABILITIES, Context, Selected
from relax_core.host.plugins import spec_problems
from relax_core.specs import BEHAVIOUR_NUMERATORS, ComponentSpec, EstimatorCapabilities, api_version_problem, resolve

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_FLAG_RE = re.compile(r"^--[a-z][a-z0-9]*(-[a-z0-9]+)*$")


def require(condition: Any, message: str) -> None:
    """``assert`` that keeps its message as written (pytest rewrites plain ``assert`` in
    this package, which would append its own introspection)."""
    if not condition:
        raise AssertionError(message)


class Checks:
    """Collects failed checks instead of stopping at the first."""

    def __init__(self, label: str):
        self.label = label
        self.failures: list[str] = []

    @contextmanager
    def check(self, name: str) -> Iterator[None]:
        try:
            yield
        except AssertionError as e:
            self.failures.append(f"{name}: {e}" if str(e) else name)
        except Exception as e:  # noqa: BLE001 - a crash is a failed check, reported with its origin
            tb = traceback.extract_tb(e.__traceback__)[-1]
            self.failures.append(f"{name}: raised {type(e).__name__}: {e} (at {tb.filename}:{tb.lineno})")

    def fail(self, name: str, message: str) -> None:
        self.failures.append(f"{name}: {message}")

    def raise_if_failed(self) -> None:
        if self.failures:
            lines = "\n".join(f"  - {f}" for f in self.failures)
            raise AssertionError(f"{self.label}: {len(self.failures)} contract check(s) failed:\n{lines}")


def check_contract(spec: ComponentSpec, params: Any = None, *, config: RunConfig | None = None,
                   distributed: bool = True) -> None:
    """Check one component against the plugin contract (see :mod:`relax_authoring.testing`).

    Args:
        spec: the spec a registration hook returns.
        params: parameter values to check with (an instance of ``spec.params``); default:
            the schema's defaults.  Capabilities are resolved for these values.
        config: the :class:`RunConfig` to build the component with (e.g. one with
            ``rm_url`` for a remote scorer); default: :func:`config_for` ``(spec, params)``,
            which meets an estimator's declared requirements.
        distributed: run the 2-rank context-parallel check for components declaring
            ``supports_context_parallel`` (set ``False`` only where processes cannot be
            spawned).

    Raises:
        AssertionError: listing every failed check.
    """
    checks = Checks(f"{getattr(spec, 'kind', '?')} '{getattr(spec, 'name', '?')}'")
    params = _check_spec(spec, params, checks)
    caps = None
    with checks.check("capabilities"):
        caps = _check_capabilities(spec, params)
    if caps is not None or type(spec).capabilities_type is None:
        kind = spec.kind
        if config is None:
            config = config_for(spec, params)
        if kind == "estimator" and caps is not None:
            from relax_authoring.testing.components import check_estimator

            check_estimator(spec, params, caps, config, checks, distributed=distributed)
        elif kind == "correction" and caps is not None:
            from relax_authoring.testing.components import check_correction

            check_correction(spec, params, caps, config, checks)
        elif kind == "reward":
            from relax_authoring.testing.components import check_reward_scorer

            check_reward_scorer(spec, params, config, checks)
        elif kind == "reward_processor":
            from relax_authoring.testing.components import check_reward_processor

            check_reward_processor(spec, params, config, checks)
        elif kind == "sampler":
            from relax_authoring.testing.samplers import check_sampler

            check_sampler(spec, params, config, checks)
        elif kind == "environment" and caps is not None:
            from relax_authoring.testing.components import check_environment

            check_environment(spec, params, caps, config, checks)
    checks.raise_if_failed()


def _check_spec(spec: ComponentSpec, params: Any, checks: Checks) -> Any:
    with checks.check("spec type"):
        require(isinstance(spec, ComponentSpec), f"not a relax spec: {type(spec).__name__}")
        require(dataclasses.is_dataclass(spec) and type(spec).__dataclass_params__.frozen, "spec must be frozen")
    with checks.check("name"):
        require(isinstance(spec.name, str) and _NAME_RE.match(spec.name), f"{spec.name!r} must match [a-z][a-z0-9_]*")
    with checks.check("summary"):
        require(isinstance(spec.summary, str) and spec.summary.strip(), "empty summary")
        require("\n" not in spec.summary.strip(), "summary must be one line")
    with checks.check("source"):
        require(isinstance(spec.source, str) and spec.source.strip(), "empty source (give the paper and section/equation)")
    with checks.check("api_version"):
        why = api_version_problem(spec.kind, spec.api_version)
        require(why is None, f"api_version {spec.api_version}: {why}")
    with checks.check("factory resolves"):
        fn = resolve(spec.factory)
        require(callable(fn), f"{spec.factory} is not callable")
    if getattr(spec, "kind", None) == "data_source":
        with checks.check("scheme"):
            require(isinstance(spec.scheme, str) and _NAME_RE.match(spec.scheme), f"bad scheme {spec.scheme!r}")
    with checks.check("the loader's spec checks"):
        problems = spec_problems(spec, spec.kind)
        require(not problems, "; ".join(problems))
    if getattr(spec, "kind", None) == "reward" and spec.auto_labels is not None:
        with checks.check("auto_labels resolves"):
            pred = resolve(spec.auto_labels)
            require(callable(pred), f"{spec.auto_labels} is not callable")
            require(all(isinstance(pred(x), bool) for x in ("13", 42, "x", None)),
                    f"{spec.auto_labels}(label) must return a bool for any label")
    if spec.params is None:
        with checks.check("params"):
            require(params is None, "params given, but the spec has no parameter schema")
        return None
    ok = True
    with checks.check("params schema"):
        ok = False
        require(dataclasses.is_dataclass(spec.params) and isinstance(spec.params, type), f"params must be a dataclass type, got {spec.params!r}")
        require(spec.params.__dataclass_params__.frozen, "params dataclass must be frozen (@dataclass(frozen=True))")
        ok = True
    if not ok:
        return params
    with checks.check("param flags"):
        clash = flag_collisions({spec.name: spec.params})
        require(not clash, "; ".join(clash))
    for f in dataclasses.fields(spec.params):
        flag = param_flag(spec.name, f)
        with checks.check(f"param {f.name}"):
            require(f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING, "no default")
            require(str(f.metadata.get("help", "")).strip(), "no help text (declare it with relax_core.param)")
            require(_FLAG_RE.match(flag), f"flag {flag!r} must look like --lower-case-words")
            if f.default is not dataclasses.MISSING:
                bad = check_bounds(f.default, f.metadata, flag)
                require(not bad, f"default outside its declared bounds: {'; '.join(bad)}")
    if params is None:
        with checks.check("params defaults"):
            params = spec.params()
    else:
        with checks.check("params given"):
            require(isinstance(params, spec.params), f"params must be a {spec.params.__name__}, got {type(params).__name__}")
            bad = [p for f in dataclasses.fields(params)
                   for p in check_bounds(getattr(params, f.name), f.metadata, param_flag(spec.name, f))]
            require(not bad, "; ".join(bad))
    return params


def _check_capabilities(spec: ComponentSpec, params: Any) -> Any:
    want = type(spec).capabilities_type
    if want is None:
        require(spec.capabilities is None, f"{spec.kind} specs take no capabilities")
        return None
    caps = spec.capabilities_for(params)
    require(type(caps) is want, f"capabilities_for(params) must return a {want.__name__}, got {type(caps).__name__}")
    devices = getattr(caps, "devices", None)
    if devices is not None:
        require(isinstance(devices, frozenset) and devices and devices <= {"cpu", "cuda"},
                f"devices must be a non-empty frozenset of 'cpu'/'cuda', got {devices!r}")
    if isinstance(caps, EstimatorCapabilities):
        require(isinstance(caps.min_group_size, int) and caps.min_group_size >= 1, "min_group_size must be an int >= 1")
        require(caps.kl_level in ("token", "sequence"), f"kl_level {caps.kl_level!r} not token|sequence")
        require(caps.behaviour_numerator in BEHAVIOUR_NUMERATORS,
                f"behaviour_numerator must be one of {', '.join(BEHAVIOUR_NUMERATORS)}, got {caps.behaviour_numerator!r} "
                "(corrections refuse an undeclared one)")
        require(not (caps.requires_reward_side_kl and "kl_coef" not in caps.uses_options),
                "requires_reward_side_kl without kl_coef in uses_options")
        from relax_core.host.capabilities import SCOPED_OPTIONS

        require(set(caps.uses_options) <= set(SCOPED_OPTIONS),
                f"uses_options {sorted(caps.uses_options)} names options outside {list(SCOPED_OPTIONS)}")
        require(all(isinstance(m, str) and m for m in caps.metrics), "metrics must be non-empty names")
    return caps


# --------------------------------------------------------------------------- configs


def config_for(spec: ComponentSpec, params: Any = None, **overrides: Any) -> RunConfig:
    """A small :class:`RunConfig` that satisfies an estimator's declared requirements: the
    values each row of the capability table gives for them (``Capability.satisfy``: group
    size, per-token loss, KL terms, normalisation), with ``params`` as its parameters and
    ``overrides`` applied last."""
    values: dict[str, Any] = {"rollout_batch_size": 3, "n_samples_per_prompt": 4, "rollout_max_response_len": 8}
    caps = spec.capabilities_for(params) if spec.kind == "estimator" else None
    if isinstance(caps, EstimatorCapabilities):
        for cap in CAPABILITIES:
            if cap.kind == "estimator" and cap.satisfy is not None:
                values.update(cap.satisfy(caps))
    values.update(overrides)
    pp = {spec.name: params if params is not None else spec.default_params()} if spec.params is not None else {}
    return RunConfig(**values, plugin_params=pp)


def capability_problems(kind: str, name: str, caps: Any, cfg: RunConfig) -> list[tuple[str, str]]:
    """``(capability, message)`` for each row of the capability table of ``kind`` that
    refuses ``caps`` under ``cfg`` (the component alone: no engine or backend chosen)."""
    sel = Selected(kind, name, caps, "contract-kit")
    ctx = Context(cfg=cfg, estimator=sel if kind == "estimator" else None,
                  corrections=(sel,) if kind == "correction" else ())
    out = []
    for cap in CAPABILITIES:
        if cap.kind == kind and cap.check is not None:
            msg = cap.check(ctx, caps)
            if msg:
                out.append((cap.field, msg))
    return out
