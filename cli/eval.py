"""``relax eval``: score a model, a checkpoint or a run's final model on evaluation sets.

What is evaluated (``MODEL_OR_RUN``, see :func:`resolve_target`): a run directory (its
``final/``, or with ``--checkpoint step_N`` that checkpoint's trained weights on the run's
model), a checkpoint directory, a Hugging Face model directory, or a model name.  The data
(``--eval-data NAME=SOURCE``, any ``--data`` scheme) are read by
:func:`relax_core.data.load_dataset` and scored by :func:`relax_core.stages.rewarding.resolve_scorers`
through :func:`relax_core.run.launch.make_score`, and samples come from the run's rollout engine
through :class:`relax_core.stages.rollout.Rollout`: the same code as ``relax train``.  A run
directory lends its configuration (model, engine, chat template, prompt suffix, ``--reward``,
data keys); eval sampling is always this command's own (:class:`EvalSettings`).

Per set: greedy decoding (temperature 0, one sample per prompt) gives ``pass@1_greedy``;
``--n-samples K`` adds ``K`` samples per prompt at ``--eval-temperature`` /
``--eval-top-p``, giving the mean accuracy, ``pass@k`` and ``maj@k`` for every
``--pass-k`` value (:mod:`relax_core.evaluation.metrics`).  Every figure has its standard error
and 95 % interval over prompts.  Output: a table on stdout, ``eval.json`` and
``eval_samples.jsonl`` in ``--out``.  Bad input: one line per problem, exit 2, before any
model loads.
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from relax_core.config import named_source
from relax_core.run.launch import BadInput


@dataclass(frozen=True)
class EvalSettings:
    """Eval sampling and size, independent of the training run's ``--rollout-*`` settings."""

    n_samples: int = 0
    """Samples per prompt besides the greedy one (0: greedy only)."""
    pass_k: tuple[int, ...] = ()
    """The k of pass@k and maj@k (each <= ``n_samples``); empty: 1 and ``n_samples``."""
    temperature: float = 1.0
    top_p: float = 1.0
    max_response_len: int | None = None
    """Max new tokens per response, greedy and sampled; ``None``: the run's
    ``--rollout-max-response-len``."""
    max_prompts: int | None = None
    """At most this many prompts of each set (the first ones); ``None``: all."""
    seed: int = 0
    """The sampling seed of the ``n_samples`` samples."""

    def ks(self) -> tuple[int, ...]:
        return self.pass_k or tuple(sorted({1, self.n_samples}))


@dataclass
class Target:
    """What :func:`resolve_target` found."""

    model: str
    """The model the engine loads (a directory or a name)."""
    weights: Path | None
    """A checkpoint's trained weights to load over ``model`` (safetensors, HF names)."""
    run_dir: Path | None
    cfg: Any
    """The :class:`~relax_core.config.RunConfig`: the run's (from its ``config.json``) or the
    defaults, with ``model`` set and the local launcher."""
    label: str
    """How the output names what was evaluated (``run/final``, ``run/step_000010``, …)."""


def _config(run_dir: Path | None, model: str | None, schemas: dict) -> Any:
    """The run's configuration (``model`` from it unless given), or the defaults."""
    from relax_core.config import ConfigError, build_config
    from relax_core.run.resume import saved_values

    values = saved_values(json.loads((run_dir / "config.json").read_text()), schemas)[0] if run_dir else {}
    values["launcher"] = "local"
    if model is not None:
        values["model"] = model
    try:
        return build_config(yaml_values=values, param_schemas=schemas, yaml_source="config.json")
    except ConfigError as e:
        raise BadInput([f"{run_dir}/config.json: {p}" for p in e.problems]) from None


def resolve_target(target: str, checkpoint: str | None, schemas: dict) -> Target:
    """What ``relax eval TARGET`` evaluates.

    - a run directory (holds ``run_info.json``): ``final/``, or ``--checkpoint step_N``
      (``N`` with or without zero padding) of its checkpoint directory;
    - a checkpoint directory (holds ``trainer_state.json``) of a run: its trained weights
      (``backend/actor.safetensors``, the torch backend's) over the run's model;
    - of a LoRA run (``--lora-rank``), only ``final/merged/`` (``--save-hf-merged``): its
      ``final/`` and checkpoints hold the adapter, refused;
    - a Hugging Face model directory, or a model name (the embedded default or a hub name).

    Args:
        schemas: the registry's plugin parameter schemas (to read a run's ``config.json``).

    Raises:
        BadInput: a missing ``final/`` or checkpoint (naming those saved), ``--checkpoint``
            with something that is not a run, a checkpoint without torch-backend weights,
            a model that cannot load.
    """
    from relax_core.models import model_problem
    from relax_core.run.checkpoint import complete_checkpoints
    from relax_core.run.resume import checkpoint_dir

    path = Path(target).expanduser()
    if (path / "run_info.json").is_file():
        cfg = _config(path, None, schemas)
        root = checkpoint_dir(cfg, path)
        saved = ", ".join(p.name for p in complete_checkpoints(root)) or "none"
        if checkpoint is None and cfg.lora_rank:  # final/ holds the adapter (PEFT format)
            merged = path / "final" / "merged"
            if not (merged / "config.json").is_file():
                raise BadInput(f"{path} is a LoRA run: its final/ holds the adapter, which relax eval cannot load yet; "
                               "evaluate final/merged/, written by a run with --save-hf-merged")
            return Target(str(merged), None, path, _config(path, str(merged), schemas), f"{path.name}/final/merged")
        if checkpoint is None:
            if not (path / "final" / "config.json").is_file():
                raise BadInput(f"{path} has no final/ model (the run stopped early, or ran with --no-save-hf); "
                               f"choose a checkpoint with --checkpoint (saved: {saved})")
            return Target(str(path / "final"), None, path, _config(path, str(path / "final"), schemas),
                          f"{path.name}/final")
        m = re.fullmatch(r"(?:step_)?(\d+)", checkpoint)
        ck = root / (f"step_{int(m.group(1)):06d}" if m else checkpoint)
        if not (ck / "trainer_state.json").is_file():
            raise BadInput(f"--checkpoint {checkpoint}: no checkpoint {ck} (saved: {saved})")
        path = ck
    elif checkpoint is not None:
        raise BadInput(f"--checkpoint {checkpoint} needs a run directory (one with run_info.json); {target} is not one")
    if (path / "trainer_state.json").is_file():
        run_dir = next((p for p in path.resolve().parents if (p / "run_info.json").is_file()), None)
        if run_dir is None:
            raise BadInput(f"{path}: a checkpoint outside a run directory (no run_info.json above it), so the model "
                           "it was trained from is unknown; evaluate the run directory with --checkpoint")
        cfg = _config(run_dir, None, schemas)
        if cfg.lora_rank:
            raise BadInput(f"{path}: a LoRA checkpoint holds the adapter only, which relax eval cannot load yet; "
                           "evaluate final/merged/ of a run with --save-hf-merged")
        weights = path / "backend" / "actor.safetensors"
        if not weights.is_file():
            raise BadInput(f"{path}: no backend/actor.safetensors (only torch-backend checkpoints can be evaluated); "
                           "evaluate the run's final/ instead")
        return Target(cfg.model, weights, run_dir, cfg, f"{run_dir.name}/{path.name}")
    problem = model_problem(target)
    if problem:
        raise BadInput(problem.replace("--model ", "", 1))
    return Target(target, None, None, _config(None, target, schemas), path.name if path.is_dir() else target)


@dataclass
class EvalSet:
    """One loaded evaluation set."""

    name: str
    source: str
    data: Any
    """The :class:`~relax_core.data.Dataset`."""


def load_sets(specs: list[tuple[str | None, str]], cfg: Any, reg: Any, scorer: Any) -> list[EvalSet]:
    """Load every ``--eval-data`` set and check that its scorers exist and build.

    Raises:
        BadInput: one line per set that cannot be read, or whose scorer is missing; two sets
            with one name.
    """
    from relax_core.data import DataError, load_dataset
    from relax_core.stages.rewarding import RewardSetupError

    problems, sets = [], []
    for name, source in specs:
        try:
            ds = load_dataset(source, cfg, reg)
            scorer.check([r["metadata"] for r in ds.rows])
        except (DataError, RewardSetupError) as e:
            problems.append(str(e).replace("--data ", "--eval-data ", 1))
            continue
        sets.append(EvalSet(name or ds.name, source, ds))
    names = [s.name for s in sets]
    problems += [f"--eval-data: two sets are named '{n}'; name them NAME=SOURCE" for n in sorted(set(names))
                 if names.count(n) > 1]
    if problems:
        raise BadInput(problems)
    return sets


def _answers(scorer: Any, batch: Any) -> list[str | None] | None:
    """The answer the scorer extracts from each response (its ``extract_answer``; ``None``
    where it finds none or fails); ``None`` when no scorer of the batch extracts answers."""
    extracts = [getattr(scorer.resolve(meta), "extract_answer", None) for meta in batch.metadata]
    if all(e is None for e in extracts):
        return None
    out = []
    for extract, response, label, meta in zip(extracts, batch.responses, batch.labels, batch.metadata):
        try:
            out.append(None if extract is None else extract(response, label, meta or {}))
        except Exception:  # noqa: BLE001 - a scorer's extraction that fails gives no answer
            out.append(None)
    return out


def _records(set_name: str, mode: str, batch: Any, answers: list[str | None] | None) -> list[dict]:
    return [{"set": set_name, "mode": mode, "prompt_index": int(batch.prompt_index[i]), "prompt": batch.prompts[i],
             "response": batch.responses[i], "answer": None if answers is None else answers[i], "label": batch.labels[i],
             "reward": float(batch.rewards[i]), "response_len": int(batch.response_lengths[i]),
             "truncated": bool(batch.truncated[i])} for i in range(batch.size)]


def evaluate_set(rollout: Any, scorer: Any, ev: EvalSet, settings: EvalSettings, max_len: int,
                 stop: tuple[str, ...]) -> tuple[dict, list[dict]]:
    """Greedy, then (``n_samples > 0``) sampled generation on one set; its metrics
    (name → :meth:`~relax_core.evaluation.metrics.Estimate.as_dict`) and sample records."""
    import torch

    from relax_core.contracts import SamplingParams
    from relax_core.evaluation.metrics import CORRECT_REWARD, estimate, majority_correct, pass_at_k, sample_metrics

    rows = ev.data.rows
    idx = list(range(min(len(rows), settings.max_prompts or len(rows))))
    out: dict[str, dict] = {}
    records: list[dict] = []
    runs = [("greedy", 1, SamplingParams(temperature=0.0, max_new_tokens=max_len, stop=stop, seed=settings.seed))]
    if settings.n_samples:
        runs.append(("sampled", settings.n_samples,
                     SamplingParams(temperature=settings.temperature, top_p=settings.top_p, max_new_tokens=max_len,
                                    stop=stop, seed=settings.seed)))
    for mode, n, sampling in runs:
        batch = rollout.score(rollout.generate(rows, idx, n, sampling, 0))[0]
        answers = _answers(scorer, batch)
        records += _records(ev.name, mode, batch, answers)
        shape = (len(idx), n)  # generate() repeats each prompt n times in a row
        m = sample_metrics(batch.rewards.view(shape), batch.response_lengths.view(shape), batch.truncated.view(shape))
        accuracy = m.pop("accuracy")
        if mode == "greedy":
            m = {"pass@1": accuracy, **m}
        else:
            correct = batch.rewards.view(shape) >= CORRECT_REWARD  # [P, n]
            counts = torch.full((len(idx),), n)
            head = {"accuracy": accuracy}
            head.update({f"pass@{k}": estimate(pass_at_k(counts, correct.sum(1), k)) for k in settings.ks()})
            if answers is not None:  # the scorer extracts answers: majority vote
                per_prompt = [answers[p * n:(p + 1) * n] for p in range(len(idx))]
                head.update({f"maj@{k}": estimate(majority_correct(per_prompt, correct, k)) for k in settings.ks()})
            m = {**head, **m}
        out[mode] = {name: e.as_dict() for name, e in m.items()}
    return out, records


def _out_dir(target: Target, out: str | None) -> Path:
    if out:
        return Path(out).expanduser()
    if target.run_dir is not None:
        return target.run_dir / "eval" / target.label.rsplit("/", 1)[-1]
    return Path("eval-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", target.label))


def prepare(target_arg: str, *, eval_data: list[str], checkpoint: str | None, settings: EvalSettings,
            reward: str | None, custom_rm_path: str | None, reg: Any,
            bf16: bool | None = None) -> tuple[Target, list[EvalSet], Any, list[str]]:
    """Everything checked before a model loads: the target, the settings, the scorer, the
    data, and that a correct label scores (:func:`relax_core.host.reward_check.label_check`, as
    ``relax train`` checks).  ``bf16``: ``--bf16``/``--no-bf16`` (``None``: the run's
    decision, or for a model :func:`relax_core.run.precision.resolve_bf16`'s).  Returns
    ``(target, sets, scorer, warnings to show)``.

    Raises:
        BadInput: one line per problem.
    """
    import dataclasses

    from relax_core.host.reward_check import label_check
    from relax_core.stages.rewarding import RewardSetupError, resolve_scorers

    target = resolve_target(target_arg, checkpoint, reg.param_schemas())
    cfg = target.cfg
    problems = [f"--pass-k {k}: needs 1 <= k <= --n-samples ({settings.n_samples})"
                for k in settings.pass_k if not 1 <= k <= settings.n_samples]
    if not 0 < settings.top_p <= 1:
        problems.append(f"--eval-top-p {settings.top_p}: must be in (0, 1]")
    if settings.temperature <= 0 and settings.n_samples:
        problems.append("--eval-temperature must be > 0 for --n-samples (the greedy pass@1 is always computed)")
    if cfg.custom_rm_path and custom_rm_path != cfg.custom_rm_path and reward is None:
        problems.append(f"the run scored with --custom-rm-path {cfg.custom_rm_path} (code from a path, not read from "
                        "a config file unasked): pass --custom-rm-path again to score with it, or choose --reward")
    if problems:
        raise BadInput(problems)
    # one scorer: --reward, the custom one, or the run's first --reward (its task's own scorer)
    cfg = dataclasses.replace(cfg, reward=(reward,) if reward else ("auto",) if custom_rm_path else cfg.reward[:1],
                              reward_weights=(), custom_rm_path=custom_rm_path,
                              bf16=cfg.bf16 if bf16 is None else bf16)
    sources = [named_source(v) for v in eval_data] or ([(cfg.eval_name, cfg.eval_source)] if cfg.eval_source else [])
    if not sources:
        raise BadInput("no evaluation data: give --eval-data NAME=SOURCE (any --data format, e.g. "
                       "rg:chain_sum?size=200&seed=7)")
    try:
        (scorer,) = resolve_scorers(cfg, reg)
    except RewardSetupError as e:
        raise BadInput(str(e)) from None
    target.cfg = cfg
    sets = load_sets(sources, cfg, reg, scorer)
    problems, warnings = label_check(scorer, [(f"--eval-data {s.name}", s.data) for s in sets], cfg)
    if problems:
        raise BadInput(problems)
    return target, sets, scorer, warnings + overlap_warnings(target, sets, reg)


def overlap_warnings(target: Target, sets: list[EvalSet], reg: Any) -> list[str]:
    """For a run directory: one warning per evaluation set whose prompts occur among the
    rows the run trained on (its ``--data``, less its own evaluation prompts when it ran with
    ``--exclude-eval-prompts``): those prompts do not measure held-out accuracy."""
    if target.run_dir is None:
        return []
    from relax_core.data import DataError, run_datasets

    cfg = target.cfg
    try:
        train = run_datasets(cfg, reg)[0]
    except DataError as e:
        return [f"the run's training data could not be read to check the evaluation sets against it ({e})"]
    trained = {row["prompt"] for row in train.rows}
    out = []
    for s in sets:
        n = sum(row["prompt"] in trained for row in s.data.rows)
        if n:
            out.append(f"--eval-data {s.name}: {n} of its {len(s.data)} prompts are among the run's training rows "
                       f"(--data {cfg.data}): they do not measure held-out accuracy")
    return out


def run_eval(target: Target, sets: list[EvalSet], scorer: Any, settings: EvalSettings, reg: Any,
             out: str | None = None) -> tuple[dict, Path]:
    """Load the engine (the run's ``--rollout-engine``) and evaluate every set; write
    ``eval.json`` and ``eval_samples.jsonl`` into ``out`` (default: ``<run>/eval/<final or
    step_N>/`` for a run, ``./eval-<model>/`` otherwise).  Returns ``(the eval.json
    content, the output directory)``."""
    from relax_core import __version__
    from relax_core.reporting.metrics import git_commit
    from relax_core.run.components import Components
    from relax_core.run.launch import make_score
    from relax_core.run.precision import resolve_bf16
    from relax_core.stages.episodes import build_runner
    from relax_core.stages.rollout import Publisher, Rollout

    cfg = resolve_bf16(target.cfg)[0]  # a run's saved decision; for a bare model, --bf16's default
    out_dir = _out_dir(target, out)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    engine = reg.get("engine", cfg.rollout_engine).spec.build(cfg.params_for(cfg.rollout_engine), cfg)
    episodes = None
    try:
        if target.weights is not None:
            from safetensors.torch import load_file

            engine.update_weights(load_file(str(target.weights)), 0)
        score = make_score([scorer], cfg)
        episodes = build_runner(cfg, reg, engine, score)
        comps = Components(engine=engine, backend=None, estimator=None, corrections=[], processors=[],
                           score=score, sampler=None,  # evaluation draws no training prompts
                           episodes=episodes)
        rollout = Rollout(cfg, comps, sets[0].data, Publisher(engine, lambda: None, 1))
        max_len = settings.max_response_len or cfg.rollout_max_response_len
        results, samples = {}, []
        for ev in sets:
            metrics, records = evaluate_set(rollout, scorer, ev, settings, max_len, tuple(cfg.rollout_stop))
            results[ev.name] = {"source": ev.source, "prompts": min(len(ev.data), settings.max_prompts or len(ev.data)),
                                "rows": len(ev.data), "scorers": sorted({scorer.name_for(r["metadata"]) for r in ev.data.rows}),
                                **metrics}
            samples += records
    finally:
        if episodes is not None:
            episodes.close()
        shutdown = getattr(engine, "shutdown", None)
        if shutdown:
            shutdown()
    run_info = json.loads((target.run_dir / "run_info.json").read_text()) if target.run_dir else {}
    report = {
        "target": target.label, "model": target.model,
        "weights": None if target.weights is None else str(target.weights),
        "run_git_commit": run_info.get("git_commit"),
        "relax_core": __version__, "git_commit": git_commit(Path(__file__).resolve().parent),
        "engine": cfg.rollout_engine, "bf16": cfg.bf16, "settings": {**asdict(settings), "pass_k": list(settings.ks()) if settings.n_samples
                                                   else [], "max_response_len": max_len,
                                                   "stop": list(cfg.rollout_stop),
                                                   "apply_chat_template": cfg.apply_chat_template},
        "command": sys.argv, "wall_s": time.monotonic() - t0, "sets": results,
    }
    (out_dir / "eval.json").write_text(json.dumps(report, indent=2, default=str))
    with open(out_dir / "eval_samples.jsonl", "w") as f:
        for r in samples:
            f.write(json.dumps(r, default=str) + "\n")
    return report, out_dir


def _fmt(v: float, metric: str) -> str:
    if v != v:  # NaN
        return "-"
    if metric.split("@")[0] in ("pass", "maj", "accuracy", "truncated_ratio"):
        return f"{100 * v:.1f}%"
    return f"{v:.1f}" if metric == "response_len" else f"{v:.3f}"


def report_table(report: dict) -> Any:
    """The rich table of an ``eval.json`` report: one row per set, mode and metric (mean,
    95 % interval, standard error), about 70 columns wide."""
    from rich.table import Table

    table = Table(title=f"relax eval: {report['target']}")
    for col in ("set", "mode", "metric", "mean", "95% interval", "se"):
        table.add_column(col, justify="right" if col in ("mean", "95% interval", "se") else "left",
                         no_wrap=col != "set")
    for name, res in report["sets"].items():
        for mode in ("greedy", "sampled"):
            for metric, e in res.get(mode, {}).items():
                table.add_row(name, mode, metric, _fmt(e["mean"], metric),
                              f"{_fmt(e['ci95_low'], metric)} – {_fmt(e['ci95_high'], metric)}",
                              _fmt(e["se"], metric))
    return table
