"""``relax plugins new``: write a complete, installable plugin package.

The package it writes installs with ``pip install -e DIR`` and passes its own tests
unchanged: a ``pyproject.toml`` with the ``relax.plugins`` entry point, ``plugin.py`` with
the spec and its capabilities, an implementation file with a docstring template for the
equation and the source, tests that run the contract kit, and a README.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from string import Template

from relax_core.specs import KINDS as SPEC_KINDS

KINDS = tuple(k.name for k in SPEC_KINDS if k.scaffold)

_PYPROJECT = Template('''\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "relax-$dash"
version = "0.1.0"
description = $qsummary
readme = "README.md"
requires-python = ">=3.11"
dependencies = ["relax-core>=0.1"]

[project.entry-points."relax.plugins"]
$name = "relax_$name.plugin"

[tool.setuptools.packages.find]
include = ["relax_$name*"]

[tool.pytest.ini_options]
addopts = "-p no:cacheprovider --import-mode=importlib"
''')

_README = Template('''\
# relax-$dash

A Relax $kind plugin: $summary

## Install and use

    pip install -e .
    relax plugins show $name
$usage
## Develop

    pip install -e . pytest
    pytest tests

`relax_$name/plugin.py` registers the spec (name, summary, source, parameters,
capabilities, factory); `relax_$name/$impl.py` holds the implementation.  Capabilities are
declared, never inferred: what you do not declare is refused at startup.  The tests run the
contract kit (`relax_contract` fixture), which picks its checks from those declarations.
Publish with `python -m build` and `twine upload dist/*`.
''')

# how to see it in the capability matrix (scorers declare no capabilities) and select it
_USAGE = {
    "estimator": "    relax capabilities --kind estimator\n    relax train --advantage-estimator {name} --dry-run\n",
    "correction": "    relax capabilities --kind correction\n    relax train --correction {name} --dry-run\n",
    "reward": "    relax train --reward {name} --dry-run\n",
    "reward_processor": "    relax capabilities --kind reward_processor\n"
                        "    relax train --reward-processor {name} --dry-run\n",
    "engine": "    relax capabilities --kind engine\n    relax train --rollout-engine {name} --dry-run\n",
    "backend": "    relax capabilities --kind backend\n    relax train --train-backend {name} --dry-run\n",
    "sampler": "    relax capabilities --kind sampler\n    relax train --sampler {name} --dry-run\n",
    "environment": "    relax capabilities --kind environment\n    relax train --environment {name} --dry-run\n",
}

_PLUGIN = {
    "estimator": Template('''\
"""Hook implementations of relax-$dash (registration only: nothing heavy is imported)."""

from dataclasses import dataclass

from relax_core import EstimatorCapabilities, EstimatorSpec, hookimpl, param


@dataclass(frozen=True)
class Params:
    baseline_scale: float = param(1.0, "Weight of the group-mean baseline subtracted from each reward.", ge=0.0, le=1.0)


@hookimpl
def relax_register_estimators():
    return [EstimatorSpec(
        name="$name",
        summary=$qsummary,
        source="TODO: paper title, section and equation number",
        factory="relax_$name.$impl:build",
        params=Params,
        capabilities=EstimatorCapabilities(
            sync_only=True,               # unclipped loss: on-policy updates only
            supports_context_parallel=True,
            min_group_size=2,
            behaviour_numerator="log_probs",  # no ratio: the loss is −sg(A)·log π_θ
            allows_reward_post_processors=True,
        ),
    )]
'''),
    "correction": Template('''\
"""Hook implementations of relax-$dash (registration only: nothing heavy is imported)."""

from dataclasses import dataclass

from relax_core import CorrectionCapabilities, CorrectionSpec, hookimpl, param


@dataclass(frozen=True)
class Params:
    clip: float = param(2.0, "Upper bound of the importance weight.", flag="--$dash-clip", gt=0.0)


@hookimpl
def relax_register_corrections():
    return [CorrectionSpec(
        name="$name",
        summary=$qsummary,
        source="TODO: paper title, section and equation number",
        factory="relax_$name.$impl:build",
        params=Params,
        capabilities=CorrectionCapabilities(
            requires_fields=frozenset({"rollout_log_probs"}),
            behaviour_numerators=frozenset({"old_log_probs", "log_probs"}),  # any estimator that declares one
            conflicts_with_rollout_logprobs_as_old=True,
        ),
    )]
'''),
    "reward": Template('''\
"""Hook implementations of relax-$dash (registration only: nothing heavy is imported)."""

from relax_core import RewardScorerSpec, hookimpl


@hookimpl
def relax_register_reward_scorers():
    return [RewardScorerSpec(
        name="$name",
        summary=$qsummary,
        source="TODO: where the scoring rule comes from",
        factory="relax_$name.$impl:build",
    )]
'''),
    "reward_processor": Template('''\
"""Hook implementations of relax-$dash (registration only: nothing heavy is imported)."""

from dataclasses import dataclass

from relax_core import RewardProcessorCapabilities, RewardProcessorSpec, hookimpl, param


@dataclass(frozen=True)
class Params:
    penalty: float = param(1.0, "Subtracted from the reward of a truncated response.", ge=0.0)


@hookimpl
def relax_register_reward_processors():
    return [RewardProcessorSpec(
        name="$name",
        summary=$qsummary,
        source="TODO: where the shaping rule comes from",
        factory="relax_$name.$impl:build",
        params=Params,
        capabilities=RewardProcessorCapabilities(
            allowed_with_strict_estimators=False,  # it changes reward values
            may_request_more_samples=False,        # it drops no groups
        ),
    )]
'''),
    "engine": Template('''\
"""Hook implementations of relax-$dash (registration only: nothing heavy is imported)."""

from relax_core import EngineCapabilities, EngineSpec, hookimpl


@hookimpl
def relax_register_rollout_engines():
    return [EngineSpec(
        name="$name",
        summary=$qsummary,
        source="TODO: the inference library this wraps",
        factory="relax_$name.$impl:build",
        capabilities=EngineCapabilities(devices=frozenset({"cpu"}), provides_fields=frozenset({"rollout_log_probs"}),
                                        supports_weight_update=True),
    )]
'''),
    "backend": Template('''\
"""Hook implementations of relax-$dash (registration only: nothing heavy is imported)."""

from relax_core import BackendCapabilities, BackendSpec, hookimpl


@hookimpl
def relax_register_train_backends():
    return [BackendSpec(
        name="$name",
        summary=$qsummary,
        source="TODO: the training library this wraps",
        factory="relax_$name.$impl:build",
        capabilities=BackendCapabilities(devices=frozenset({"cpu"})),
    )]
'''),
    "sampler": Template('''\
"""Hook implementations of relax-$dash (registration only: nothing heavy is imported)."""

from relax_core import SamplerCapabilities, SamplerSpec, hookimpl


@hookimpl
def relax_register_samplers():
    return [SamplerSpec(
        name="$name",
        summary=$qsummary,
        source="TODO: paper title and section of the selection rule",
        factory="relax_$name.$impl:build",
        capabilities=SamplerCapabilities(needs_stable_prompt_ids=False),  # True if it keeps per-prompt statistics
    )]
'''),
    "environment": Template('''\
"""Hook implementations of relax-$dash (registration only: nothing heavy is imported)."""

from dataclasses import dataclass

from relax_core import EnvironmentCapabilities, EnvironmentSpec, hookimpl, param


@dataclass(frozen=True)
class Params:
    reminder: str = param("Check your answer and give it again.", "The reply to the model's first answer.")


@hookimpl
def relax_register_environments():
    return [EnvironmentSpec(
        name="$name",
        summary=$qsummary,
        source="TODO: where the task or the interaction protocol comes from",
        factory="relax_$name.$impl:build",
        params=Params,
        capabilities=EnvironmentCapabilities(
            multi_turn=True,      # two model turns: the engine continues from tokens
            turn_rewards=False,   # no reward of its own: the run's scorer scores the last answer
        ),
    )]
'''),
}

_IMPL = {
    "estimator": Template('''\
"""$docsummary

Equation (TODO: replace with your method's, and cite it):

    A_i = R_i − β · mean_{j ∈ g(i)} R_j                  (group-mean baseline)
    L_t = −sg(A_i) · log π_θ(y_t | x, y_<t)              (REINFORCE, unclipped)

Glossary: R = ``rewards`` [B] (NaN = unscored → advantage 0), g(i) = samples with the
same ``group_index``, β = ``baseline_scale``, A = ``advantages`` [B, T], log π_θ =
``log_probs`` [B, T].  Source: TODO (paper, section, equation).
"""

from __future__ import annotations

import torch

from relax_core.contracts import AdvantageInput, AdvantageOutput, PolicyLossInput, PolicyLossOutput
from relax_core.numerics import broadcast_to_tokens, group_stats
from relax_core.policy import reinforce_loss


class Estimator:
    def __init__(self, baseline_scale: float):
        self.baseline_scale = baseline_scale

    def compute_advantages(self, inp: AdvantageInput) -> AdvantageOutput:
        r = inp.rewards.to(torch.float32)                                    # [B]
        scored = torch.isfinite(r)                                           # [B]
        mean = group_stats(r, inp.group_index, scored)["mean"]               # [B]
        adv = torch.where(scored, r - self.baseline_scale * mean, torch.zeros_like(r))
        tokens = broadcast_to_tokens(adv, inp.loss_mask)                     # [B, T]
        return AdvantageOutput(advantages=tokens, returns=tokens.clone())

    def policy_loss(self, inp: PolicyLossInput) -> PolicyLossOutput:
        return reinforce_loss(inp.log_probs, inp.old_log_probs, inp.advantages, inp.loss_mask)


def build(params, config) -> Estimator:
    return Estimator(baseline_scale=params.baseline_scale)
'''),
    "correction": Template('''\
"""$docsummary

Equation (TODO: replace with your method's, and cite it):

    w_t = sg(min(exp(log num − log q), C)),   L'_t = w_t · L_t

Glossary: log num = the estimator's behaviour numerator (``inp.behaviour_numerator`` names
the field: ``old_log_probs`` for a loss with a ratio to the old policy, ``log_probs`` for one
without), log q = ``rollout_log_probs`` (engine), C = ``clip``, L = the estimator's per-token
loss.  Source: TODO.
"""

from __future__ import annotations

import torch

from relax_core.contracts import CorrectionInput, CorrectionOutput


class Correction:
    def __init__(self, clip: float):
        self.clip = clip

    def apply(self, inp: CorrectionInput) -> CorrectionOutput:
        mask = inp.loss_mask.bool()
        num = getattr(inp, inp.behaviour_numerator).detach()
        log_ratio = torch.where(mask, num.float() - inp.rollout_log_probs.float(),
                                torch.zeros((), dtype=torch.float32))       # [B, T]
        w = torch.exp(log_ratio.clamp(-20, 20)).clamp(max=self.clip).detach()
        w = torch.where(mask, w, torch.zeros_like(w))
        return CorrectionOutput(loss=inp.loss * w, token_metrics={"$name": w})


def build(params, config) -> Correction:
    return Correction(clip=params.clip)
'''),
    "reward": Template('''\
"""$docsummary

Rule (TODO: replace): 1.0 when the last line of the response equals the label (stripped),
0.0 otherwise; ``None`` when the label is missing (cannot be scored).
"""

from __future__ import annotations


def score(response: str, label, metadata: dict) -> float | None:
    if label is None:
        return None
    lines = [line.strip() for line in response.strip().splitlines() if line.strip()]
    return 1.0 if lines and lines[-1] == str(label).strip() else 0.0


def build(params, config):
    return score
'''),
    "reward_processor": Template('''\
"""$docsummary

Rule (TODO: replace with yours, and cite it):

    r_i ← r_i − penalty · 1[y_i truncated]

Glossary: r = ``rewards`` float32 [B] (NaN = unscored, stays NaN), ``truncated`` bool [B]
(the response hit --rollout-max-response-len).  A metric named without a ``/`` is logged
as ``rollout/<name>``.
"""

from __future__ import annotations

from relax_core.contracts import RewardBatch


class Processor:
    def __init__(self, penalty: float):
        self.penalty = penalty

    def process(self, batch: RewardBatch) -> RewardBatch:
        hit = batch.truncated.to(batch.rewards.dtype)                      # [B]
        frac = float(hit.mean()) if hit.numel() else 0.0
        return batch.replace(rewards=batch.rewards - self.penalty * hit,
                             metrics={**batch.metrics, "${name}_frac": frac})


def build(params, config) -> Processor:
    return Processor(penalty=params.penalty)
'''),
    "engine": Template('''\
"""$docsummary

TODO: wrap your inference library.  Implement the ``RolloutEngine`` protocol of
``relax_core.contracts``: ``generate(prompt_ids, sampling) -> GenerationOutput`` with the
sampled token ids, the ``loss_mask`` of the positions that carry loss
(``relax_core.batch.length_mask`` for one completion per prompt), the per-token
log-probs of the sampled tokens under the sampling distribution (``rollout_log_probs``),
and ``update_weights(state_dict, version)``.
"""

from __future__ import annotations

from relax_core.contracts import GenerationOutput, SamplingParams


class Engine:
    tokenizer = None

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> GenerationOutput:
        raise NotImplementedError("TODO: generate with your inference library")

    def update_weights(self, state_dict, version: int) -> None:
        raise NotImplementedError("TODO: load new weights")

    def shutdown(self) -> None:
        pass


def build(params, config) -> Engine:
    return Engine()
'''),
    "backend": Template('''\
"""$docsummary

TODO: wrap your training library.  Implement the ``TrainBackend`` protocol of
``relax_core.contracts``: ``forward``; the gradient half of an optimizer step
(``accumulate_gradients``, ``grad_norm``, ``apply_gradients``, ``zero_grad``,
``optimizer_steps``: the core decides skipping, clipping and the learning rate,
``relax_core.stages.optimizer``); ``engine_state_dict``, ``save_checkpoint``/``load_checkpoint``,
``save_hf``.
"""

from __future__ import annotations


class Backend:
    def forward(self, batch, *, role="actor", entropy=False, top_k=False):
        raise NotImplementedError("TODO")

    def accumulate_gradients(self, batch, loss_fn, *, role="actor"):
        raise NotImplementedError("TODO: forward/backward per micro-batch -> relax_core.contracts.Gradients")

    def grad_norm(self, role="actor"):
        raise NotImplementedError("TODO: the global L2 norm of the gradients")

    def apply_gradients(self, role="actor", *, lr, grad_scale=1.0):
        raise NotImplementedError("TODO: scale the gradients, step the optimizer at lr")

    def zero_grad(self, role="actor"):
        raise NotImplementedError("TODO")

    def optimizer_steps(self, role="actor"):
        raise NotImplementedError("TODO: steps applied so far")


def build(params, config) -> Backend:
    return Backend()
'''),
    "sampler": Template('''\
"""$docsummary

Rule (TODO: replace with yours, and cite it): the d-th call of ``take(k)`` returns k distinct
rows drawn uniformly, ``random.Random(f"relax-$name:{seed}:{d}").sample(range(n), k)``
(independent draws: a row may come back before every row was seen).

The state is the number of draws so far, so a resumed run draws what the uninterrupted one
would.  ``observe`` receives every generated sample's raw reward (``PromptResults``:
``prompt_index``, ``rewards``, ``group_index``, each ``[B]``); this sampler ignores them.
"""

from __future__ import annotations

import random

from relax_core.sampling import PromptResults, Sampler


class RandomRows(Sampler):
    def __init__(self, num_rows: int, seed: int):
        self.n, self.seed, self.draws = num_rows, seed, 0

    def take(self, k: int) -> list[int]:
        rng = random.Random(f"relax-$name:{self.seed}:{self.draws}")
        self.draws += 1
        return rng.sample(range(self.n), min(k, self.n)) + [rng.randrange(self.n) for _ in range(k - self.n)]

    def observe(self, results: PromptResults) -> None:
        pass  # TODO: learn from results.rewards per results.prompt_index

    def metrics(self) -> dict[str, float]:
        return {}  # TODO: scalars named sampler/$name/...

    def state(self) -> dict:
        return {"n": self.n, "seed": self.seed, "draws": self.draws}

    def load(self, state: dict, allow_other_data: bool = False) -> None:
        if state["n"] != self.n and not allow_other_data:
            raise ValueError(f"the checkpoint's sampler is for {state['n']} rows, these data have {self.n}")
        self.draws = int(state["draws"])


def build(params, config):
    return RandomRows
'''),
    "environment": Template('''\
"""$docsummary

Episode (TODO: replace with yours): the model answers, the environment replies with a
reminder (a user message), the model answers again and the episode ends.  It returns no
reward, so the run's scorer scores the last answer.  The host owns the tokens: it renders
the reply through the chat template (loss_mask 0) and never re-tokenises the model's turns
(relax_core.environments).
"""

from __future__ import annotations

from relax_core.environments import Reply, Turn


class Environment:
    def __init__(self, reminder: str):
        self.reminder = reminder

    def start(self, row: dict) -> "Episode":
        return Episode(self.reminder)


class Episode:
    def __init__(self, reminder: str):
        self.reminder = reminder

    def step(self, turn: Turn) -> Reply:
        if turn.index == 0:
            return Reply(messages=({"role": "user", "content": self.reminder},))
        return Reply(done=True)


def build(params, config) -> Environment:
    return Environment(reminder=params.reminder)
'''),
}

_TESTS_COMMON = Template('''\
"""Tests of relax-$dash: the contract kit, plus values derived by hand."""

import json
import subprocess
import sys

from relax_$name import plugin


def _spec():
    return plugin.$hook()[0]


def test_contract(relax_contract):
    relax_contract(_spec())


def test_registered_through_the_entry_point():
    out = subprocess.run([sys.executable, "-m", "cli.main", "plugins", "--json"], capture_output=True, text=True, check=True)
    names = [c["name"] for p in json.loads(out.stdout)["plugins"] for c in p["components"]]
    assert "$name" in names
$extra''')

_EXTRA = {
    "estimator": '''

def test_advantages_and_gradient_by_hand():
    import torch
    from relax_core.contracts import AdvantageInput, PolicyLossInput

    est = _spec().build()
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]], dtype=torch.bool)
    out = est.compute_advantages(AdvantageInput(
        rewards=torch.tensor([1.0, 0.0, 0.0, float("nan")]), group_index=torch.tensor([0, 0, 1, 1]),
        loss_mask=mask))
    # group 0: mean 0.5 -> A = +0.5, -0.5; group 1: only one scorable sample (mean 0) -> 0, and NaN -> 0
    torch.testing.assert_close(out.advantages[:, 0], torch.tensor([0.5, -0.5, 0.0, 0.0]))
    assert out.advantages[1, 1] == 0  # masked position
    logp = torch.full((4, 2), -1.0, requires_grad=True)
    loss = est.policy_loss(PolicyLossInput(log_probs=logp, old_log_probs=logp.detach(),
                                           advantages=out.advantages, loss_mask=mask)).loss
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, -out.advantages)  # d(-A log p)/d log p = -A
''',
    "correction": '''

def test_weight_by_hand_and_no_gradient_through_it():
    import math

    import torch
    from relax_core.contracts import CorrectionInput

    corr = _spec().build()
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    logp = torch.zeros(1, 3, requires_grad=True)
    base = -logp
    out = corr.apply(CorrectionInput(
        loss=base, log_probs=logp, old_log_probs=torch.tensor([[0.0, 0.0, float("nan")]]),
        rollout_log_probs=torch.tensor([[math.log(2.0), -5.0, 1e9]]), advantages=torch.ones(1, 3),
        loss_mask=mask, behaviour_numerator="old_log_probs"))
    # exp(0 - log 2) = 0.5; exp(0 + 5) = 148.4 clipped to 2.0; masked slot 0
    torch.testing.assert_close(out.token_metrics["$name"], torch.tensor([[0.5, 2.0, 0.0]]))
    out.loss.sum().backward()
    torch.testing.assert_close(logp.grad, -torch.tensor([[0.5, 2.0, 0.0]]))
''',
    "reward": '''

def test_scores():
    score = _spec().build()
    assert score("work...\\n42", 42, {}) == 1.0
    assert score("work...\\n41", 42, {}) == 0.0
    assert score("", 42, {}) == 0.0
    assert score("42", None, {}) is None
''',
    "reward_processor": '''

def test_penalty_by_hand():
    import math

    import torch
    from relax_core.contracts import RewardBatch

    proc = _spec().build()  # penalty 1.0
    batch = RewardBatch(rewards=torch.tensor([1.0, 0.0, float("nan"), 0.5]), group_index=torch.tensor([0, 0, 1, 1]),
                        response_lengths=torch.tensor([8, 3, 8, 2]), truncated=torch.tensor([True, False, True, False]),
                        responses=["a", "b", "c", "d"], keep=torch.ones(4, dtype=torch.bool))
    out = proc.process(batch)
    # 1 - 1 = 0; untouched; NaN stays NaN (unscored); untouched
    assert out.rewards[[0, 1, 3]].tolist() == [0.0, 0.0, 0.5] and math.isnan(out.rewards[2])
    assert out.metrics["${name}_frac"] == 0.5
    assert out.keep.all() and out.group_index.tolist() == [0, 0, 1, 1]
''',
    "engine": "",
    "backend": "",
    "sampler": '''

def test_draws_by_hand_and_resumes():
    import random

    make = _spec().build()
    s = make(5, 3)
    assert s.take(2) == random.Random("relax-$name:3:0").sample(range(5), 2)
    saved = s.state()
    assert saved == {"n": 5, "seed": 3, "draws": 1}
    nxt = s.take(4)
    again = make(5, 3)
    again.load(saved)
    assert again.take(4) == nxt == random.Random("relax-$name:3:1").sample(range(5), 4)
''',
    "environment": '''

def test_episode_by_hand():
    from relax_core.environments import Turn

    episode = _spec().build().start({"prompt": "What is 2 + 3?", "label": "5", "metadata": {}})
    first = episode.step(Turn(text="4", index=0))
    assert not first.done and first.messages == ({"role": "user", "content": "Check your answer and give it again."},)
    last = episode.step(Turn(text="5", index=1))
    assert last.done and last.reward is None  # the run's scorer scores "5"
''',
}

_HOOKS = {k.name: k.hook for k in SPEC_KINDS}
_IMPL_NAMES = {"estimator": "estimator", "correction": "correction", "reward": "scorer",
               "reward_processor": "processor", "engine": "engine", "backend": "backend",
               "sampler": "sampler", "environment": "environment"}


def write_plugin(kind: str, name: str, dest: str | Path | None = None, summary: str | None = None) -> Path:
    """Write the package ``relax-<name>`` for a component ``name`` of ``kind``.

    Args:
        kind: one of :data:`KINDS`.
        name: component name, ``[a-z][a-z0-9_]*``.
        dest: parent directory (default: the current directory).
        summary: one-line description.

    Returns:
        The package directory.

    Raises:
        ValueError: bad kind or name.
        FileExistsError: the directory exists and is not empty.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"plugin name {name!r} must match [a-z][a-z0-9_]* (it is also the import package relax_<name>)")
    dash = name.replace("_", "-")
    root = Path(dest or ".") / f"relax-{dash}"
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} exists and is not empty")
    summary = summary or f"TODO: one line saying what the {kind} '{name}' does."
    if "\n" in summary or not summary.strip():
        raise ValueError("the summary must be one non-empty line")
    impl = _IMPL_NAMES[kind]
    subs = dict(name=name, dash=dash, kind=kind.replace("_", " "), summary=summary, impl=impl, hook=_HOOKS[kind],
                qsummary=json.dumps(summary, ensure_ascii=False),  # a TOML and a Python string literal
                docsummary=summary.replace("\\", "\\\\").replace('"', '\\"'),  # inside a docstring
                usage=_USAGE[kind].format(name=name))
    files = {
        "pyproject.toml": _PYPROJECT.substitute(subs),
        "README.md": _README.substitute(subs),
        f"relax_{name}/__init__.py": '"""relax-%s: %s"""\n' % (dash, subs["docsummary"]),
        f"relax_{name}/plugin.py": _PLUGIN[kind].substitute(subs),
        f"relax_{name}/{impl}.py": _IMPL[kind].substitute(subs),
        f"tests/test_{name}.py": _TESTS_COMMON.substitute(subs, extra=Template(_EXTRA[kind]).substitute(subs)),
    }
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root
