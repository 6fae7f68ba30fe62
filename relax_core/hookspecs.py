"""Hook specifications of the ``relax`` pluggy project.

Every hook is a *registration* hook: it is called once per process when the plugin
registry is built (the CLI process, and each worker process: Ray actors and torchrun ranks
load plugins themselves from the ``relax.plugins`` entry points).  Each returns a list of
frozen spec objects from :mod:`relax_core.specs`.  The training loop never dispatches
through pluggy: it calls the plain objects the specs build.

A plugin module implements any subset of these hooks with ``@relax_core.hookimpl``.
Implementations must be cheap: no torch or other heavy import at module level or inside
the hook (heavy imports belong in the spec's factory).
"""

from __future__ import annotations

import pluggy

from relax_core.specs import KINDS

PROJECT = "relax"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def relax_register_estimators() -> list:
    """Return a list of :class:`~relax_core.specs.EstimatorSpec` (advantage estimators).

    Called once per process when the registry is built (CLI and every worker).
    """


@hookspec
def relax_register_corrections() -> list:
    """Return a list of :class:`~relax_core.specs.CorrectionSpec` (train/inference
    mismatch corrections).  Called once per process when the registry is built."""


@hookspec
def relax_register_reward_scorers() -> list:
    """Return a list of :class:`~relax_core.specs.RewardScorerSpec` (per-sample scorers).
    Called once per process when the registry is built (including reward workers)."""


@hookspec
def relax_register_reward_processors() -> list:
    """Return a list of :class:`~relax_core.specs.RewardProcessorSpec` (batch reward
    post-processors).  Called once per process when the registry is built."""


@hookspec
def relax_register_rollout_engines() -> list:
    """Return a list of :class:`~relax_core.specs.EngineSpec` (rollout engines).
    Called once per process when the registry is built (including engine actors)."""


@hookspec
def relax_register_train_backends() -> list:
    """Return a list of :class:`~relax_core.specs.BackendSpec` (training backends).
    Called once per process when the registry is built (including training ranks)."""


@hookspec
def relax_register_data_sources() -> list:
    """Return a list of :class:`~relax_core.specs.DataSourceSpec` (``--data scheme:...``
    readers).  Called once per process when the registry is built."""


@hookspec
def relax_register_environments() -> list:
    """Return a list of :class:`~relax_core.specs.EnvironmentSpec` (episode drivers for
    ``--environment``).  Called once per process when the registry is built."""


#: hook name -> spec kind it returns (from :data:`relax_core.specs.KINDS`)
HOOK_KINDS = {k.hook: k.name for k in KINDS}
