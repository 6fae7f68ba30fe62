"""Relax core: the training loop, the data contract between stages, configuration,
validation, the plugin host, checkpoints and metrics.

Everything that varies (estimators, corrections, rewards, rollout engines, training
backends, data sources) is a plugin registered through the hooks in
:mod:`relax_core.hookspecs`.  This module is the public API for plugin authors: it
must stay importable without torch.
"""

from relax_core.specs import (
    API_VERSION,
    BackendCapabilities,
    BackendSpec,
    CorrectionCapabilities,
    CorrectionSpec,
    DataSourceSpec,
    EngineCapabilities,
    EngineSpec,
    EstimatorCapabilities,
    EstimatorSpec,
    RewardProcessorCapabilities,
    RewardProcessorSpec,
    RewardScorerSpec,
    SamplingConstraints,
    param,
)
from relax_core.hookspecs import hookimpl

__version__ = "0.1.0"

__all__ = [
    "API_VERSION",
    "BackendCapabilities",
    "BackendSpec",
    "CorrectionCapabilities",
    "CorrectionSpec",
    "DataSourceSpec",
    "EngineCapabilities",
    "EngineSpec",
    "EstimatorCapabilities",
    "EstimatorSpec",
    "RewardProcessorCapabilities",
    "RewardProcessorSpec",
    "RewardScorerSpec",
    "SamplingConstraints",
    "hookimpl",
    "param",
    "__version__",
]
