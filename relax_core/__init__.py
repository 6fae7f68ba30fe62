"""Relax core: the training loop, the data contract between stages, configuration,
validation, the plugin host, checkpoints and metrics.

Everything that varies (estimators, corrections, rewards, rollout engines, training
backends, data sources, prompt samplers) is a plugin registered through the hooks in
:mod:`relax_core.hookspecs`.

The public API for plugin authors is exactly :data:`__all__`: the spec and capability
types, :func:`param`, :data:`hookimpl` and :data:`API_VERSION` (importable without torch),
and six modules, imported lazily on first access: ``batch`` (the declared batch fields),
``contracts`` (the data contract between stages), ``numerics`` (masked reductions, group statistics, KL, normalisation), ``policy``
(PPO-clip, REINFORCE, the group advantage stage), ``sampling`` (the prompt sampler contract) and
``environments`` (the episode contract of environments).  The contract kit is
``relax_authoring.testing``; final-answer extraction for scorers is the library ``relax_answers``.
Specs declare the ``api_version`` they were written against; the loader refuses versions it
does not support.  Everything else in ``relax_core`` is internal and may change.
"""

import importlib as _importlib

from relax_core.hookspecs import hookimpl
from relax_core.specs import (
    API_VERSION,
    BEHAVIOUR_NUMERATORS,
    BackendCapabilities,
    BackendSpec,
    CorrectionCapabilities,
    CorrectionSpec,
    DataSourceSpec,
    DualClipParams,
    EngineCapabilities,
    EngineSpec,
    EnvironmentCapabilities,
    EnvironmentSpec,
    EstimatorCapabilities,
    EstimatorSpec,
    GroupAdvantageParams,
    PPOClipParams,
    RewardProcessorCapabilities,
    RewardProcessorSpec,
    RewardScorerSpec,
    SamplerCapabilities,
    SamplerSpec,
    SamplingConstraints,
    param,
)

__version__ = "0.1.0"

__all__ = [
    "API_VERSION",
    "BEHAVIOUR_NUMERATORS",
    "BackendCapabilities",
    "BackendSpec",
    "CorrectionCapabilities",
    "CorrectionSpec",
    "DataSourceSpec",
    "EngineCapabilities",
    "EngineSpec",
    "EnvironmentCapabilities",
    "EnvironmentSpec",
    "EstimatorCapabilities",
    "DualClipParams",
    "EstimatorSpec",
    "GroupAdvantageParams",
    "PPOClipParams",
    "RewardProcessorCapabilities",
    "RewardProcessorSpec",
    "RewardScorerSpec",
    "SamplerCapabilities",
    "SamplerSpec",
    "SamplingConstraints",
    "hookimpl",
    "param",
    "__version__",
    "batch",
    "contracts",
    "numerics",
    "policy",
    "sampling",
    "environments",
]

_LAZY_MODULES = ("batch", "contracts", "numerics", "policy", "sampling", "environments")


def __getattr__(name: str):
    if name in _LAZY_MODULES:
        return _importlib.import_module(f"relax_core.{name}")
    raise AttributeError(f"module 'relax_core' has no attribute {name!r}")
