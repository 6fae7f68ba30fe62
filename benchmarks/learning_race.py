"""The learning race: Relax against TRL's ``GRPOTrainer`` in held-out accuracy per wall-clock
second, on identical work (issue 23 §3).

    .venv/bin/python benchmarks/learning_race.py                  # the race: 3 seeds per side, writes the results
    .venv/bin/python benchmarks/learning_race.py --seeds 0,1,2,3,4 --steps 30
    .venv/bin/python benchmarks/learning_race.py --keep R.json --work-dir W --seeds 3   # add seed 3 to race R
    .venv/bin/python benchmarks/learning_race.py --keep R.json --work-dir W --rerun trl:0 --reason "..."
    .venv/bin/python benchmarks/learning_race.py --keep R.json --work-dir W --rerun relax:0 --reason "new defaults"
    .venv/bin/python benchmarks/learning_race.py --check-only     # only the same-update check
    .venv/bin/python benchmarks/learning_race.py --smoke          # tiny model, 2 steps, 1 seed (the smoke test)

**1. The same update.**  Before racing, one identical batch (2 prompts × 4 completions, fixed
token ids, rewards 1, 0, 0, 1 in each group) goes through both trainers' real update paths:
Relax's ``relax train --load-debug-rollout-data`` (estimator, loss, clipping, AdamW) and a
stock ``GRPOTrainer.train()`` whose generation returns those completions and whose reward
function returns those rewards (TRL's prompt tokens are checked equal to Relax's).  Global
``torch.optim`` step hooks record, on each side, the gradient the optimizer receives (after
clipping) and the parameters before and after the step.  Compared: the loss, the gradient
norm before clipping (each side's own), the gradient cosine, and the parameter change.  The
two sides normalise advantages with different epsilons, ``(r − mean)/(std + 1e-6)`` in Relax
and ``(std + 1e-4)`` in TRL; with the same group std ``s`` in both groups (here
``s = std(1, 0, 0, 1) = 0.57735``) Relax's gradient is exactly TRL's times
``(s + 1e-4)/(s + 1e-6) = 1.000171``, so that ratio is the prediction, not a tolerance.  The race
refuses to run when any criterion of ``CHECK_TOLERANCE`` fails.

**2. The race.**  Both sides train on the same model files and the same rows: the default
task's training rows less every row whose question is one of the held-out prompts (the
default evaluation set, ``--eval-data``), written to one JSONL file; Relax draws its prompts
from it in its seeded order and records them (``trained_prompts.jsonl``), and TRL gets exactly
that sequence (``shuffle_dataset=False``; the prompts its reward function sees are checked
against Relax's afterwards).  The reward is ``benchmarks/e2e_reward.py`` on both sides
(the default task's scorer does not exist in TRL's venv).  Every other knob is Relax's default
(``relax_core.config.RunConfig``) mapped to its ``GRPOConfig`` field; the results file lists
every knob on both sides as each tool recorded it (Relax's ``config.json``, TRL's
``GRPOConfig.to_dict()``), and says where a knob has no counterpart.  The sides run one
after the other (Relax seed s, then TRL seed s), each seed's pair before the next, with the
load average recorded before and after every run.  Both save a checkpoint every
``--save-every`` steps (optimizer state included on both sides); a checkpoint's wall-clock
time is the newest modification time of its files less the launch time of its process, so
start-up counts.  After each run one evaluator, ``relax eval`` (greedy pass@1, the same
code, scorer and held-out set for both), scores every checkpoint, and the checkpoints are
deleted (disk).

Output (``--out``, default ``benchmarks/results/learning-race-<UTC date>.md``, with ``.png``
and ``.json`` beside it): the knob table, the check, held-out accuracy against wall-clock
seconds per side (mean and spread over seeds, and every run), the time each side first
reaches TRL's best mean accuracy and the ratio, and where Relax's time goes (sums of its
``metrics.jsonl`` ``perf/*`` and the rest of the wall time: start-up, checkpoint saves, exit).

The full race (SmolLM2-135M-Instruct, 20 steps, checkpoints every 2, the 300 held-out prompts
of the default evaluation set, 3 seeds per side) is some 2–3 hours on an idle 2-core machine, most of it
the ~70 evaluations (about 40 s each); on a shared machine the wall-clock figures mean little: run it alone.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from e2e_trl import HERE, ROOT, TRL_PYTHON, matched_grpo_config, matched_relax_flags

#: the check's batch: two prompts (the first two training rows), four completions each, and
#: their rewards; every group has the same reward std, so the epsilon ratio is one number
CHECK_COMPLETIONS = (" 7", " The answer is 7.", " I think it is 12", " 9")
CHECK_REWARDS = (1.0, 0.0, 0.0, 1.0)
RELAX_ADV_EPS, TRL_ADV_EPS = 1e-6, 1e-4

#: pass criteria of the same-update check (float32 on both sides; the two sides sum the
#: same terms in another order: Relax's vocabulary head works in chunks, TRL's does not)
CHECK_TOLERANCE = {
    "loss_abs": 1e-6,  # |loss_relax − loss_trl| (both ≈ 0: ratio 1, group advantages sum to 0)
    "grad_cosine_min": 1 - 1e-5,  # cosine of the clipped gradients
    "norm_ratio_rel": 1e-4,  # |norm ratio / predicted − 1|, norms before clipping
    # ‖Δθ_relax − Δθ_trl‖ / ‖Δθ_trl‖ after clipping and AdamW.  At Adam's first step
    # Δθ = −lr·g/(|g| + ε_adam): saturated (±lr) where |g| ≫ 1e-8, and moved by at most the
    # epsilon ratio (1.7e-4) and by float32 rounding where |g| is near ε_adam.  Measured:
    # 9.4e-6 on the tiny Qwen3, 1.2e-4 on SmolLM2-135M (max 7.7e-6 absolute, lr 3e-5)
    "delta_rel": 1e-3,
}


@dataclass(frozen=True)
class Work:
    """What both sides train on.

    Attributes:
        prompts: prompts per step.
        group: samples per prompt (the GRPO group).
        max_new: max new tokens per response.
        lr: AdamW learning rate, constant.
        temperature: sampling temperature.
        steps: optimizer steps, one per rollout.
        save_every: steps between checkpoints.
        eval_prompts: held-out prompts scored per checkpoint (the first ones of the set).
        bf16: bfloat16 autocast on both sides (Relax's ``--bf16``, TRL's ``bf16``), else
            float32; the same-update check and the evaluator are float32 either way.
    """

    prompts: int
    group: int
    max_new: int
    lr: float
    temperature: float
    steps: int
    save_every: int
    eval_prompts: int
    bf16: bool = False  # races recorded before it existed ran in float32


def default_work() -> Work:
    """Relax's current defaults (``relax train`` with no flags), ``--bf16`` as decided on this
    machine (:func:`relax_core.run.precision.resolve_bf16`)."""
    from relax_core.config import RunConfig
    from relax_core.run.precision import resolve_bf16

    c = RunConfig()
    return Work(prompts=c.rollout_batch_size, group=c.n_samples_per_prompt, max_new=c.rollout_max_response_len,
                lr=c.lr, temperature=c.rollout_temperature, steps=c.num_rollout, save_every=2,
                eval_prompts=c.eval_max_prompts, bf16=resolve_bf16(c)[0].bf16)


SMOKE_WORK = Work(prompts=2, group=2, max_new=6, lr=1e-5, temperature=1.0, steps=2, save_every=2, eval_prompts=2)


def _env() -> dict:
    path = os.pathsep.join(p for p in (str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled",
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "RAY_AUTH_MODE": "disabled"}


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _run(cmd: list[str], log: Path, timeout: float | None = None) -> float:
    """Run ``cmd`` (stdout and stderr to ``log``); its wall seconds.  Raises RuntimeError
    naming the log on a non-zero exit."""
    t0 = time.time()
    with log.open("w") as f:
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=_env(), cwd=str(ROOT), timeout=timeout).returncode
    if code != 0:
        tail = "\n".join(log.read_text().splitlines()[-30:])
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {code}; log {log}:\n{tail}")
    return time.time() - t0


# --------------------------------------------------------------------------- data


def write_training_rows(train_source: str, eval_source: str, path: Path) -> dict:
    """Write the training rows of ``train_source`` whose prompt is not one of
    ``eval_source``'s (``relax_core.data.exclude_eval_prompts``) to ``path`` as JSONL
    (``prompt`` with the source's instruction, ``label``).  Returns the counts.

    Raises:
        AssertionError: a written prompt is a held-out prompt (the exclusion failed).
    """
    from relax_core.config import RunConfig
    from relax_core.data import exclude_eval_prompts, load_dataset
    from relax_core.host.plugins import load_registry

    cfg, reg = RunConfig(), load_registry()
    held = load_dataset(eval_source, cfg, reg)
    train = exclude_eval_prompts(load_dataset(train_source, cfg, reg), held)
    held_prompts = {r["prompt"] for r in held.rows}
    assert not held_prompts & {r["prompt"] for r in train.rows}
    path.write_text("".join(json.dumps({"prompt": r["prompt"], "label": str(r["label"])}) + "\n" for r in train.rows))
    return {"train_rows": len(train.rows), "left_out": train.held_out, "held_out_prompts": len(held.rows)}


def model_path(kind: str, work: Path) -> str:
    """``default``: the embedded SmolLM2-135M-Instruct; ``tiny``: a tiny random Qwen3; else a directory."""
    from relax_authoring.testing.models import make_tiny_model
    from relax_core.models import ensure_default_model

    if kind == "default":
        return str(ensure_default_model())
    if kind == "tiny":
        return str(make_tiny_model(work / "tiny-qwen3", seed=0))
    return kind


# --------------------------------------------------------------------------- 1. the same update


def _record_optimizer_step(names: list[tuple[str, tuple]] | None, params_to_name: dict | None, out: Path) -> None:
    """Register global ``torch.optim`` hooks that write, at the first optimizer step, the
    gradient each parameter has when the step starts (after clipping), and the parameters
    before and after, to ``out`` (safetensors, keys ``grad.<name>``, ``before.<name>``,
    ``after.<name>``).  Names come from ``params_to_name`` (id → name) or, in the
    optimizer's parameter order, from ``names`` (``(name, shape)``; a shape that differs
    raises RuntimeError)."""
    import torch
    from safetensors.torch import save_file
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    seen: dict = {}

    def name_of(opt) -> list[tuple[str, torch.Tensor]]:
        params = [p for g in opt.param_groups for p in g["params"]]
        if params_to_name is not None:
            return [(params_to_name[id(p)], p) for p in params]
        if [tuple(p.shape) for p in params] != [shape for _, shape in names]:
            raise RuntimeError("the optimizer's parameters are not the model's named parameters in order")
        return [(n, p) for (n, _), p in zip(names, params)]

    def pre(opt, args, kwargs):
        if not seen:
            seen["named"] = name_of(opt)
            for n, p in seen["named"]:
                seen[f"grad.{n}"] = p.grad.detach().float().clone()
                seen[f"before.{n}"] = p.detach().float().clone()

    def post(opt, args, kwargs):
        if "named" in seen and not out.exists():
            tensors = {k: v for k, v in seen.items() if k != "named"}
            tensors.update({f"after.{n}": p.detach().float().clone() for n, p in seen["named"]})
            save_file(tensors, str(out))

    register_optimizer_step_pre_hook(pre)
    register_optimizer_step_post_hook(post)


def write_check_batch(model_dir: str, rows: list[dict], out_dir: Path) -> dict:
    """The check's batch as Relax's stored rollout (``--load-debug-rollout-data``) and as
    JSON for TRL's side: the chat-templated prompt ids of ``rows[:2]``, the token ids of
    ``CHECK_COMPLETIONS`` (no EOS, not truncated), the rewards ``CHECK_REWARDS``."""
    import torch
    from transformers import AutoTokenizer

    from relax_core.batch import Batch, length_mask

    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts = [r["prompt"] for r in rows[:2]]
    pids = [list(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False)) for p in prompts]
    cids = [tok(c, add_special_tokens=False)["input_ids"] for c in CHECK_COMPLETIONS]
    n, g = len(prompts), len(CHECK_COMPLETIONS)
    width = max(map(len, cids))
    lengths = torch.tensor([len(c) for c in cids] * n)
    response_ids = torch.tensor([c + [tok.pad_token_id or 0] * (width - len(c)) for c in cids] * n)
    batch = Batch(prompt_ids=[pids[i // g] for i in range(n * g)], response_ids=response_ids,
                  loss_mask=length_mask(lengths, width), response_lengths=lengths,
                  truncated=torch.zeros(n * g, dtype=torch.bool),
                  prompts=[prompts[i // g] for i in range(n * g)], responses=list(CHECK_COMPLETIONS) * n,
                  group_index=torch.arange(n).repeat_interleave(g), prompt_index=torch.arange(n).repeat_interleave(g),
                  weight_version=torch.zeros(n * g, dtype=torch.long), labels=[rows[i // g]["label"] for i in range(n * g)],
                  metadata=[{} for _ in range(n * g)], rewards=torch.tensor(CHECK_REWARDS * n))
    batch.save(out_dir / "relax-rollout" / "step_000001")  # the first step is step 1
    spec = {"prompts": prompts, "prompt_ids": pids, "completion_ids": cids, "rewards": list(CHECK_REWARDS) * n,
            "labels": [r["label"] for r in rows[:2]], "max_new": width}
    (out_dir / "check_batch.json").write_text(json.dumps(spec))
    return spec


def predicted_norm_ratio(rewards: tuple[float, ...]) -> float:
    """Relax's gradient norm over TRL's for one group std ``s`` of ``rewards`` (unbiased):
    ``(s + 1e-4)/(s + 1e-6)`` (the advantages are the same up to that factor)."""
    s = statistics.stdev(rewards)
    return (s + TRL_ADV_EPS) / (s + RELAX_ADV_EPS)


def same_update(model_dir: str, rows: list[dict], work: Work, out: Path) -> dict:
    """Run the check (module docstring, part 1); returns every figure and ``passed``."""
    out.mkdir(parents=True, exist_ok=True)
    spec = write_check_batch(model_dir, rows, out)
    data = out / "check_rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    relax_flags = [*matched_relax_flags(model=model_dir, data=str(data), prompts=2, group=len(CHECK_COMPLETIONS),
                                        max_new=spec["max_new"], lr=work.lr, temperature=work.temperature, seed=0,
                                        bf16=False),
                   "--num-rollout", "1", "--load-debug-rollout-data", str(out / "relax-rollout"), "--eval-data", "none",
                   "--no-save-hf", "--output-dir", str(out), "--run-name", "relax", "--quiet", "--wandb-mode", "disabled",
                   "--force"]
    _run([sys.executable, __file__, "--worker", "relax-update", "--model-dir", model_dir, "--out-dir", str(out), "--",
          *relax_flags], out / "relax-update.log", timeout=1800)
    _run([str(TRL_PYTHON), __file__, "--worker", "trl-update", "--model-dir", model_dir, "--out-dir", str(out),
          "--work", json.dumps(asdict(work))], out / "trl-update.log", timeout=1800)
    m = next(json.loads(line) for line in (out / "relax" / "metrics.jsonl").read_text().splitlines()
             if "train/loss" in line)
    trl = json.loads((out / "trl_update.json").read_text())
    upd = compare_updates(out / "relax_update.safetensors", out / "trl_update.safetensors")
    predicted = predicted_norm_ratio(CHECK_REWARDS)
    res = {"samples": len(spec["rewards"]), **upd, "loss_relax": m["train/loss"], "loss_trl": trl["loss"],
           "grad_norm_relax": m["train/grad_norm"], "grad_norm_trl": trl["grad_norm"],
           "norm_ratio": m["train/grad_norm"] / trl["grad_norm"], "norm_ratio_predicted": predicted}
    res["failures"] = check_failures(res)
    res["passed"] = not res["failures"]
    return res


def compare_updates(relax_file: Path, trl_file: Path) -> dict:
    """Compare two recorded optimizer steps (:func:`_record_optimizer_step`), one parameter
    at a time in float64 (two whole models in float64 would not fit beside each other):
    ``parameters`` (count), ``same_initial_weights``, ``grad_cosine``, ``delta_rel``
    (‖Δθ_relax − Δθ_trl‖ / ‖Δθ_trl‖), ``delta_max_abs``, ``delta_norm_relax``, ``delta_norm_trl``.

    Raises:
        RuntimeError: the two files name other parameters.
    """
    import torch
    from safetensors import safe_open

    s = dict.fromkeys(("rt", "rr", "tt", "dr", "dt", "dd", "dd_max", "n"), 0.0)
    same_start = True
    with safe_open(str(relax_file), "pt") as r, safe_open(str(trl_file), "pt") as t:
        names = sorted(k[5:] for k in r.keys() if k.startswith("grad."))
        if names != sorted(k[5:] for k in t.keys() if k.startswith("grad.")):
            raise RuntimeError("the two sides' parameter names differ: not the same model")
        for n in names:
            gr, gt = (f.get_tensor(f"grad.{n}").double().flatten() for f in (r, t))
            br, bt = (f.get_tensor(f"before.{n}") for f in (r, t))
            dr, dt = ((f.get_tensor(f"after.{n}") - b).double().flatten() for f, b in ((r, br), (t, bt)))
            same_start &= torch.equal(br, bt)
            for key, x, y in (("rt", gr, gt), ("rr", gr, gr), ("tt", gt, gt), ("dr", dr, dr), ("dt", dt, dt),
                              ("dd", dr - dt, dr - dt)):
                s[key] += float(x @ y)
            s["dd_max"] = max(s["dd_max"], float((dr - dt).abs().max()))
            s["n"] += gr.numel()
    return {"parameters": int(s["n"]), "same_initial_weights": same_start,
            "grad_cosine": s["rt"] / math.sqrt(s["rr"] * s["tt"]), "delta_rel": math.sqrt(s["dd"] / s["dt"]),
            "delta_max_abs": s["dd_max"], "delta_norm_relax": math.sqrt(s["dr"]), "delta_norm_trl": math.sqrt(s["dt"])}


def check_failures(res: dict) -> list[str]:
    """The criteria of ``CHECK_TOLERANCE`` that the check's figures ``res`` miss (empty: passed)."""
    tol = CHECK_TOLERANCE
    return [why for ok, why in [
        (res["same_initial_weights"], "the two sides did not start from the same weights"),
        (abs(res["loss_relax"] - res["loss_trl"]) <= tol["loss_abs"], f"loss differs by more than {tol['loss_abs']}"),
        (res["grad_cosine"] >= tol["grad_cosine_min"], f"gradient cosine below {tol['grad_cosine_min']}"),
        (abs(res["norm_ratio"] / res["norm_ratio_predicted"] - 1) <= tol["norm_ratio_rel"],
         f"gradient norm ratio off the epsilon prediction {res['norm_ratio_predicted']:.6f} by more than "
         f"{tol['norm_ratio_rel']} (relative)"),
        (res["delta_rel"] <= tol["delta_rel"], f"parameter change differs by more than {tol['delta_rel']} (relative)"),
    ] if not ok]


def relax_update_worker(a: argparse.Namespace) -> None:
    """``relax train`` in this process, with the optimizer step recorded."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(a.model_dir)
    names = [(n, tuple(p.shape)) for n, p in model.named_parameters() if p.requires_grad]
    del model
    _record_optimizer_step(names, None, Path(a.out_dir) / "relax_update.safetensors")
    from cli.main import app

    app(["train", *a.relax_args], standalone_mode=False)


def _trl_trainer(a: argparse.Namespace, work: Work, rows: list[dict], reward_func, **overrides):
    """A stock ``GRPOTrainer`` on ``rows`` (in order) with the matched ``GRPOConfig``
    (``e2e_trl.matched_grpo_config``) plus ``overrides``."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}], "label": r["label"]} for r in rows])
    config = {**matched_grpo_config(prompts=work.prompts, group=work.group, max_new=work.max_new, lr=work.lr,
                                    temperature=work.temperature, seed=a.seed, bf16=work.bf16),
              "output_dir": a.out_dir, "max_steps": work.steps, "shuffle_dataset": False, **overrides}
    args = GRPOConfig(**config)
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(a.model_dir)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return GRPOTrainer(model=model, reward_funcs=reward_func, args=args, train_dataset=ds, processing_class=tok)


def trl_update_worker(a: argparse.Namespace) -> None:
    """One ``GRPOTrainer.train()`` step on the check's batch, its optimizer step recorded."""
    from transformers import TrainerCallback

    out = Path(a.out_dir)
    spec = json.loads((out / "check_batch.json").read_text())
    work = Work(**{**json.loads(a.work), "prompts": len(spec["prompts"]), "group": len(CHECK_COMPLETIONS),
                   "max_new": spec["max_new"], "steps": 1, "bf16": False})
    rows = [{"prompt": p, "label": lab} for p, lab in zip(spec["prompts"], spec["labels"])]
    got: dict = {}

    def reward(completions, **kw):
        return list(spec["rewards"])

    class Log(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "grad_norm" in logs:
                got["grad_norm"] = float(logs["grad_norm"])

    trainer = _trl_trainer(a, work, rows, reward, save_strategy="no", logging_steps=1)
    trainer.add_callback(Log())
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    _record_optimizer_step(None, names, out / "trl_update.safetensors")
    g = len(CHECK_COMPLETIONS)

    def fixed_completions(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        expected = [spec["prompt_ids"][i // g] for i in range(len(spec["rewards"]))]
        if [list(p) for p in prompt_ids] != expected:
            raise RuntimeError("TRL tokenised the prompts differently from Relax")
        return [list(c) for c in spec["completion_ids"]] * len(spec["prompts"]), None

    compute_loss = trainer.compute_loss

    def recorded_loss(*args, **kw):
        loss = compute_loss(*args, **kw)
        got["loss"] = float(loss.detach())
        return loss

    trainer._generate_single_turn, trainer.compute_loss = fixed_completions, recorded_loss
    trainer.train()
    (out / "trl_update.json").write_text(json.dumps(got))


# --------------------------------------------------------------------------- 2. the race


def checkpoint_times(root: Path, pattern: str, t0: float, step_of) -> dict[int, float]:
    """Step → seconds from ``t0`` (the process launch, epoch seconds) to the newest file of
    that checkpoint directory."""
    out = {}
    for d in root.glob(pattern):
        if d.is_dir() and not d.name.endswith((".tmp", ".old")):
            out[step_of(d.name)] = max(f.stat().st_mtime for f in d.rglob("*") if f.is_file()) - t0
    return dict(sorted(out.items()))


def held_out_accuracy(target: str, out: Path, eval_source: str, work: Work, scorer: str | None,
                      checkpoint: int | None = None) -> dict:
    """Greedy pass@1 of ``relax eval`` on the held-out set: ``{"acc", "se", "scorer"}``
    (fractions; ``scorer``: the one used).  ``scorer=None`` lets the set's data source
    choose (the base model's evaluation); the checkpoints get that scorer by name, so that
    a run's own ``--custom-rm-path`` never replaces it.  Float32 (``--no-bf16``): the same instrument
    whatever precision the sides trained in."""
    cmd = [sys.executable, "-m", "cli.main", "eval", target, "--eval-data", f"heldout={eval_source}",
           "--max-prompts", str(work.eval_prompts), "--eval-max-response-len", str(work.max_new), "--out", str(out),
           "--no-bf16"]
    cmd += ["--checkpoint", str(checkpoint)] if checkpoint is not None else []
    cmd += ["--reward", scorer] if scorer else []
    out.mkdir(parents=True, exist_ok=True)
    _run(cmd, out / "eval.log", timeout=3600)
    held = json.loads((out / "eval.json").read_text())["sets"]["heldout"]
    fig = held["greedy"]["pass@1"]
    return {"acc": fig["mean"], "se": fig["se"], "scorer": held["scorers"][0]}


def relax_breakdown(metrics: Path, wall: float) -> dict:
    """Seconds per part over the run: sums of ``perf/*`` of ``metrics.jsonl``, the rest of
    the steps, and the wall time outside the steps (start-up, checkpoint saves, exit)."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if '"perf/step_time"' in line]
    part = {k: sum(r.get(f"perf/{k}_time", 0.0) for r in rows) for k in ("rollout", "reward", "train", "update_weights")}
    steps = sum(r["perf/step_time"] for r in rows)
    part["rest of the steps"] = steps - sum(part.values())
    part["start-up, checkpoint saves, exit"] = wall - steps
    return part


def trl_rows(relax_run: Path, rows: list[dict]) -> list[dict]:
    """The prompts Relax trained on, one row per group, in its order (``trained_prompts.jsonl``)."""
    seq = []
    for line in (relax_run / "trained_prompts.jsonl").read_text().splitlines():
        rec = json.loads(line)
        first = {}
        for g, i in zip(rec["group_index"], rec["prompt_index"]):
            first.setdefault(g, i)
        seq += [rows[i] for i in first.values()]
    return seq


#: what a TRL (``transformers.Trainer``) checkpoint holds besides the model directory
TRAINER_STATE_FILES = ("trainer_state.json", "optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin")


def hf_model_view(checkpoint: Path) -> Path:
    """``<checkpoint>-model/``: hard links to the model and tokenizer files of a TRL
    checkpoint, without the trainer's state (which ``relax eval`` would take for a Relax
    checkpoint)."""
    view = checkpoint.with_name(checkpoint.name + "-model")
    view.mkdir()
    for f in checkpoint.iterdir():
        if f.is_file() and f.name not in TRAINER_STATE_FILES:
            os.link(f, view / f.name)
    return view


def race_one(side: str, seed: int, model_dir: str, data: Path, rows: list[dict], work: Work, work_dir: Path,
             eval_source: str, scorer: str, relax_run: Path | None = None) -> dict:
    """One run of one side, then every checkpoint evaluated (and deleted); a run directory
    left by an earlier attempt is removed first."""
    run_dir = work_dir / f"{side}-seed{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    load0 = _load()
    t0 = time.time()
    if side == "relax":
        cmd = [sys.executable, "-m", "cli.main", "train",
               *matched_relax_flags(model=model_dir, data=str(data), prompts=work.prompts, group=work.group,
                                    max_new=work.max_new, lr=work.lr, temperature=work.temperature, seed=seed,
                                    bf16=work.bf16),
               "--num-rollout", str(work.steps), "--save-interval", str(work.save_every),
               "--keep-checkpoints", str(work.steps), "--no-save-hf", "--eval-data", "none",
               "--output-dir", str(work_dir), "--run-name", run_dir.name, "--quiet", "--wandb-mode", "disabled"]
    else:
        order = work_dir / f"trl-rows-seed{seed}.jsonl"
        order.write_text("".join(json.dumps(r) + "\n" for r in trl_rows(relax_run, rows)))
        cmd = [str(TRL_PYTHON), __file__, "--worker", "trl-race", "--model-dir", model_dir, "--out-dir", str(run_dir),
               "--rows", str(order), "--work", json.dumps(asdict(work)), "--seed", str(seed)]
    wall = _run(cmd, work_dir / f"{run_dir.name}.log")
    res = {"side": side, "seed": seed, "wall_s": wall, "load_before": load0, "load_after": _load()}
    if side == "relax":
        times = checkpoint_times(run_dir / "checkpoints", "step_*", t0, lambda n: int(n.split("_")[1]))
        res["perf"] = relax_breakdown(run_dir / "metrics.jsonl", wall)
        res["config"] = json.loads((run_dir / "config.json").read_text())
        res["prompt_order_sha256"] = order_hash([r["prompt"] for r in trl_rows(run_dir, rows)])
    else:
        times = checkpoint_times(run_dir, "checkpoint-*", t0, lambda n: int(n.split("-")[1]))
        res["config"] = json.loads((run_dir / "trl_args.json").read_text())
        seen = [json.loads(line)["prompt"] for line in (run_dir / "trl_prompts.jsonl").read_text().splitlines()]
        if seen != [r["prompt"] for r in trl_rows(relax_run, rows)]:
            raise RuntimeError(f"TRL seed {seed} trained on other prompts (or another order) than Relax")
        res["prompt_order_sha256"] = order_hash(seen)
    if not times:
        raise RuntimeError(f"{side} seed {seed} saved no checkpoint (log {work_dir / f'{run_dir.name}.log'})")
    res["checkpoints"] = []
    for step, t in times.items():
        if side == "relax":
            acc = held_out_accuracy(str(run_dir), run_dir / "eval" / f"step_{step}", eval_source, work, scorer, step)
            shutil.rmtree(run_dir / "checkpoints" / f"step_{step:06d}")
        else:
            acc = held_out_accuracy(str(hf_model_view(run_dir / f"checkpoint-{step}")), run_dir / "eval" / f"step_{step}",
                                    eval_source, work, scorer)
            shutil.rmtree(run_dir / f"checkpoint-{step}")
            shutil.rmtree(run_dir / f"checkpoint-{step}-model")
        res["checkpoints"].append({"step": step, "t_s": t, **acc})
        print(f"  {side} seed {seed} step {step}: {t:.0f} s, held-out {acc['acc']:.3f}", flush=True)
    return res


def trl_race_worker(a: argparse.Namespace) -> None:
    """``GRPOTrainer.train()`` on the rows in Relax's order, saving every ``save_every`` steps."""
    import e2e_reward

    work = Work(**json.loads(a.work))
    rows = [json.loads(line) for line in Path(a.rows).read_text().splitlines()]
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    log = (out / "trl_prompts.jsonl").open("w")
    samples = (out / "trl_completions.jsonl").open("w")
    calls = itertools.count()

    def reward(prompts, completions, label, **kw):
        for p in prompts[:: work.group]:
            log.write(json.dumps({"prompt": p[-1]["content"]}) + "\n")
        log.flush()
        rewards = e2e_reward.trl_reward(completions, label)
        k = next(calls)
        samples.writelines(json.dumps({"call": k, "response": c[-1]["content"], "label": lab, "reward": r}) + "\n"
                           for c, lab, r in zip(completions, label, rewards))
        samples.flush()
        return rewards

    trainer = _trl_trainer(a, work, rows, reward, save_strategy="steps", save_steps=work.save_every)
    (out / "trl_args.json").write_text(json.dumps({**trainer.args.to_dict(), "from_pretrained": a.model_dir}, default=str))
    trainer.train()


# --------------------------------------------------------------------------- report

#: (knob, Relax key, TRL key, must be equal, note): every knob that decides the work.  Relax's
#: keys are its ``config.json``'s, the estimator's and the backend's parameters included
#: (:func:`relax_settings`); TRL's are ``GRPOConfig``'s (``from_pretrained``: the directory
#: its worker loads).  ``None``: no counterpart.  Where "must be equal" holds, the race
#: stops when the two differ.
KNOBS = [
    ("model files", "model", "from_pretrained", True, "float32 weights on both"),
    ("dtype: bfloat16", "bf16", "bf16", True, ""),
    ("samples per step", None, "per_device_train_batch_size", False, "prompts per step × samples per prompt"),
    ("prompts per step", "rollout_batch_size", None, False, "TRL: batch ÷ num_generations"),
    ("samples per prompt", "n_samples_per_prompt", "num_generations", True, ""),
    ("max new tokens", "rollout_max_response_len", "max_completion_length", True, ""),
    ("temperature", "rollout_temperature", "temperature", True, ""),
    ("top-p", "rollout_top_p", "top_p", True, ""),
    ("top-k", "rollout_top_k", "top_k", False, "off on both: −1 in Relax, 0 in TRL"),
    ("repetition penalty", "rollout_repetition_penalty", "repetition_penalty", True, ""),
    ("learning rate", "lr", "learning_rate", True, ""),
    ("lr schedule", None, "lr_scheduler_type", False, "Relax: constant after the warm-up (its only schedule)"),
    ("warm-up steps", "lr_warmup_steps", "warmup_steps", True, ""),
    ("weight decay", "weight_decay", "weight_decay", True, ""),
    ("grad-norm clip", "clip_grad", "max_grad_norm", True, ""),
    ("AdamW β1", "adam_beta1", "adam_beta1", True, "Relax: the torch backend's parameter"),
    ("AdamW β2", "adam_beta2", "adam_beta2", True, ""),
    ("AdamW ε", "adam_eps", "adam_epsilon", True, ""),
    ("PPO clip ε (low)", "eps_clip", "epsilon", True, "Relax: the grpo estimator's parameter"),
    ("PPO clip ε (high)", "eps_clip_high", "epsilon_high", True, ""),
    ("loss reduction", "loss_reduction", "loss_type", False, "seq-mean-token-mean is TRL's grpo: per-sequence token mean"),
    ("advantage: group std", "disable_grpo_std_normalization", "scale_rewards", False,
     "group std on both; epsilon 1e-6 (Relax) vs 1e-4 (TRL), hard-coded: accounted for in the check"),
    ("KL loss coefficient", "kl_loss_coef", "beta", True, "0: no reference model on either side"),
    ("entropy bonus", "entropy_coef", None, False, "TRL has none; 0 in Relax"),
    ("updates per rollout", "num_steps_per_rollout", "steps_per_generation", True, "and TRL's num_iterations 1"),
    ("old log-probs from the engine", "use_rollout_logprobs", None, False, "both: detach(current), one update per rollout"),
    ("truncated responses masked", None, "mask_truncated_completions", False, "Relax trains on them, so does TRL with False"),
    ("gradient checkpointing", "gradient_checkpointing", "gradient_checkpointing", True, ""),
    ("prompt order", None, "shuffle_dataset", False, "TRL gets Relax's sequence, unshuffled (checked after each run)"),
    ("seed", "seed", "seed", True, "the sampling streams differ by design (another engine)"),
    ("reward", "custom_rm_path", None, False, "both benchmarks/e2e_reward.py (TRL: its trl_reward)"),
    ("reward workers", "reward_num_workers", None, False, "TRL scores in-process"),
    ("rollout engine", "rollout_engine", None, False, "TRL generates with the training model"),
    ("weight push interval", "update_weights_interval", None, False, "TRL: one model, nothing to push"),
    ("checkpoint every (steps)", "save_interval", "save_steps", True,
     "with optimizer state on both (Relax's last checkpoint without it)"),
    ("evaluation during training", "eval_data", "eval_strategy", False, "off on both: one evaluator afterwards"),
    ("device", "device", "use_cpu", False, "auto in Relax; TRL uses the accelerator unless use_cpu"),
]


def relax_settings(config: dict) -> dict:
    """A Relax run's ``config.json`` with its estimator's and training backend's parameters
    merged in (``eps_clip``, ``adam_beta1``, ...)."""
    params = config.get("plugin_params", {})
    return {**config, **params.get(config["advantage_estimator"], {}), **params.get(config["train_backend"], {})}


def knob_mismatches(relax_cfg: dict, trl_cfg: dict) -> list[str]:
    """The knobs that must be equal and are not (as each side recorded them)."""
    r = relax_settings(relax_cfg)
    return [f"{k}: Relax {rk}={r.get(rk)!r}, TRL {tk}={trl_cfg.get(tk)!r}" for k, rk, tk, same, _ in KNOBS
            if same and r.get(rk) != trl_cfg.get(tk)]


def knob_table(relax_cfg: dict, trl_cfg: dict) -> list[str]:
    r = relax_settings(relax_cfg)

    def val(cfg: dict, key: str | None) -> str:
        return "— (no counterpart)" if key is None else f"`{key}` = {cfg.get(key, '?')!r}"

    lines = ["| knob | Relax | TRL `GRPOConfig` | note |", "|---|---|---|---|"]
    lines += [f"| {k} | {val(r, rk)} | {val(trl_cfg, tk)} | {'; '.join(filter(None, ['equal' if same else '', note]))} |"
              for k, rk, tk, same, note in KNOBS]
    return lines


def curves(runs: list[dict], side: str) -> list[dict]:
    """Per checkpoint step: mean wall seconds and mean, min and max accuracy over the seeds."""
    by_step: dict[int, list[dict]] = {}
    for r in runs:
        if r["side"] == side:
            for c in r["checkpoints"]:
                by_step.setdefault(c["step"], []).append(c)
    return [{"step": s, "t_s": statistics.mean(c["t_s"] for c in cs), "acc": statistics.mean(c["acc"] for c in cs),
             "min": min(c["acc"] for c in cs), "max": max(c["acc"] for c in cs), "seeds": len(cs)}
            for s, cs in sorted(by_step.items())]


def time_to(curve: list[dict], target: float) -> float | None:
    """Wall seconds (``t_s``) of the first checkpoint of ``curve`` whose accuracy (``acc``)
    is at least ``target``; ``None`` when none is."""
    return next((c["t_s"] for c in curve if c["acc"] >= target - 1e-12), None)


def summary(runs: list[dict]) -> dict:
    """TRL's best mean accuracy over its checkpoints; the mean-curve time of each side to
    reach it and the ratio Relax/TRL; each run's own time to reach it (``None``: never);
    the final mean accuracies."""
    rc, tc = curves(runs, "relax"), curves(runs, "trl")
    best = max(c["acc"] for c in tc)
    t_relax, t_trl = time_to(rc, best), time_to(tc, best)
    per_seed = {side: [time_to(r["checkpoints"], best) for r in runs if r["side"] == side] for side in ("relax", "trl")}
    return {"trl_best": best, "t_relax": t_relax, "t_trl": t_trl,
            "ratio": t_relax / t_trl if t_relax is not None and t_trl else None, "per_seed": per_seed,
            "final_relax": rc[-1]["acc"], "final_trl": tc[-1]["acc"]}


def plot(runs: list[dict], base: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for side, colour in (("relax", "tab:blue"), ("trl", "tab:orange")):
        for r in (r for r in runs if r["side"] == side):
            ax.plot([0] + [c["t_s"] for c in r["checkpoints"]], [base["acc"]] + [c["acc"] for c in r["checkpoints"]],
                    color=colour, alpha=0.3, lw=1)
        c = curves(runs, side)
        if c:
            ax.plot([0] + [x["t_s"] for x in c], [base["acc"]] + [x["acc"] for x in c], color=colour, lw=2.5,
                    marker="o", label=f"{'Relax' if side == 'relax' else 'TRL GRPOTrainer'} (mean of {c[0]['seeds']} seeds)")
    ax.set_xlabel("wall-clock seconds since launch (start-up included)")
    ax.set_ylabel("held-out greedy pass@1")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def check_section(check: dict | None) -> list[str]:
    """The same-update check's lines of the results file."""
    lines = ["## 1. The same update", ""]
    if check is None:
        lines += ["NOT RUN: TRL's venv is absent (`make benchmarks/.envs/trl/bin/python`); Relax only below.", ""]
    else:
        lines += [f"One batch of {check['samples']} samples (2 prompts × 4 completions, rewards {CHECK_REWARDS} per group), "
                  f"{check['parameters']:,} parameters, both sides' real update path:", "",
                  "| figure | Relax | TRL | comparison |", "|---|---|---|---|",
                  f"| loss | {check['loss_relax']:.3e} | {check['loss_trl']:.3e} | difference {abs(check['loss_relax'] - check['loss_trl']):.1e} |",
                  f"| grad norm before clipping | {check['grad_norm_relax']:.6f} | {check['grad_norm_trl']:.6f} | ratio "
                  f"{check['norm_ratio']:.6f}, predicted from the epsilons {check['norm_ratio_predicted']:.6f} |",
                  f"| gradient cosine (after clipping) | | | {check['grad_cosine']:.7f} |",
                  f"| ‖Δθ‖ after clipping + AdamW | {check['delta_norm_relax']:.6e} | {check['delta_norm_trl']:.6e} | "
                  f"relative difference {check['delta_rel']:.1e}, max abs {check['delta_max_abs']:.1e} |", "",
                  "**passed**" if check["passed"] else "**FAILED**: " + "; ".join(check["failures"]), ""]
    return lines


def report(res: dict, smoke: bool) -> str:
    w, runs, base = res["work"], res["runs"], res["base"]
    lines = ["# Learning race: Relax vs TRL GRPOTrainer, held-out accuracy per wall-clock second"
             + (" (smoke run: tiny sizes, not figures)" if smoke else ""), ""]
    lines += [f"- {k}: {v}" for k, v in res["machine"].items()]
    if res.get("reruns"):
        r = res["reruns"]
        why = f" ({r['reason']})" if r["reason"] else ""
        lines.append(f"- **run in this session: {', '.join(r['runs'])}**{why}; every other run is kept from the race "
                     f"of {r['of'].get('date', '?')} at commit {r['of'].get('git commit', '?')} (load at its start "
                     f"{r['of'].get('load average at start', '?')})")
    lines += [f"- work: {w['prompts']} prompts × {w['group']} samples per step, ≤ {w['max_new']} new tokens, lr {w['lr']}, "
              f"temperature {w['temperature']}, {w['steps']} steps, checkpoint every {w['save_every']}; "
              f"held-out: first {w['eval_prompts']} prompts of `{res['eval_source']}`, greedy pass@1 by `relax eval`",
              f"- data: {res['data']['train_rows']} training rows of `{res['train_source']}` after leaving out "
              f"{res['data']['left_out']} whose question is a held-out prompt (disjoint by question text)", ""]
    lines += check_section(res["check"])
    if not runs:
        return "\n".join(lines)
    trl_cfg = next((r["config"] for r in runs if r["side"] == "trl"), None)
    if trl_cfg is not None:
        lines += ["## Every knob, as each side recorded it", ""] + knob_table(runs[0]["config"], trl_cfg) + [""]
    lines += ["## 2. Held-out accuracy against wall-clock seconds", "",
              f"Base model (step 0, t = 0): {base['acc']:.3f} (se {base['se']:.3f}); scorer `{base['scorer']}` "
              "for every checkpoint of both sides.", "",
              "| side | step | mean wall s | mean accuracy | min–max over seeds | seeds |", "|---|---|---|---|---|---|"]
    for side in ("relax", "trl"):
        lines += [f"| {side} | {c['step']} | {c['t_s']:.0f} | {c['acc']:.3f} | {c['min']:.3f}–{c['max']:.3f} | {c['seeds']} |"
                  for c in curves(runs, side)]
    lines += ["", "Every run (load average 1/5/15 min before → after):", "",
              "| side | seed | wall s | load before | after | accuracy at each checkpoint (step: s → acc ± se) |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {r['side']} | {r['seed']} | {r['wall_s']:.0f} | {r['load_before']} | {r['load_after']} | "
              + ", ".join(f"{c['step']}: {c['t_s']:.0f} → {c['acc']:.3f} ± {c['se']:.3f}" for c in r["checkpoints"]) + " |"
              for r in runs]
    lines.append("")
    if trl_cfg is not None:
        s = res["summary"]
        t_relax, t_trl = (("not reached" if t is None else f"{t:.0f} s") for t in (s["t_relax"], s["t_trl"]))
        ratio = "—" if s["ratio"] is None else f"{s['ratio']:.2f}"
        lines += [f"TRL's best mean held-out accuracy: **{s['trl_best']:.3f}**; time to reach it: Relax "
                  f"{t_relax}, TRL {t_trl}; ratio Relax/TRL **{ratio}** (target ≤ 0.5); final mean accuracy "
                  f"Relax {s['final_relax']:.3f}, TRL {s['final_trl']:.3f} (target: Relax ≥ TRL).", ""]
        for side, ts in s["per_seed"].items():
            got = [t for t in ts if t is not None]
            spread = f"; mean {statistics.mean(got):.0f} s, {min(got):.0f}–{max(got):.0f} s" if got else ""
            lines.append(f"- each {side} run's time to reach it: "
                         + ", ".join("not reached" if t is None else f"{t:.0f} s" for t in ts) + spread)
        lines.append("")
    parts = [r["perf"] for r in runs if r["side"] == "relax"]
    lines += ["## Where Relax's time goes (mean over seeds, seconds)", "", "| part | seconds | share of wall |", "|---|---|---|"]
    wall = statistics.mean(r["wall_s"] for r in runs if r["side"] == "relax")
    for k in parts[0]:
        v = statistics.mean(p[k] for p in parts)
        lines.append(f"| {k} | {v:.1f} | {v / wall:.0%} |")
    lines += [f"| wall | {wall:.1f} | 100% |", ""]
    return "\n".join(lines)


def rerun_plan(a: argparse.Namespace) -> tuple[dict | None, set[tuple[str, int]]]:
    """With ``--keep``: its results, and the ``(side, seed)`` runs to do now: those of
    ``--rerun`` and both sides of every ``--seeds`` given (``(None, set())`` without
    ``--keep``).  A TRL run done without its seed's Relax run reuses that Relax run from
    ``--work-dir`` (TRL trains on Relax's recorded prompt order).

    Raises:
        SystemExit: ``--keep`` without ``--work-dir`` or without runs to do, ``--rerun``
            without ``--keep``, an unknown side, a TRL run whose Relax run is neither done
            now nor in ``--work-dir``, or a Relax run done again beside its kept TRL run where
            the new run may train on another prompt order (:func:`same_prompt_order`).
    """
    if not a.keep:
        if a.rerun:
            raise SystemExit("--rerun needs --keep (the earlier race's .json) and its --work-dir")
        return None, set()
    if not a.work_dir:
        raise SystemExit("--keep needs the --work-dir of the kept race's runs")
    kept = json.loads(Path(a.keep).read_text())
    todo = {(side, int(seed)) for side in ("relax", "trl") for seed in (a.seeds.split(",") if a.seeds else [])}
    for item in (a.rerun.split(",") if a.rerun else []):
        side, _, seed = item.partition(":")
        if side not in ("relax", "trl") or not seed.isdigit():
            raise SystemExit(f"--rerun {item}: expected relax:SEED or trl:SEED")
        todo.add((side, int(seed)))
    if not todo:
        raise SystemExit("--keep: nothing to run (give --rerun SIDE:SEED or --seeds)")
    kept_runs = {(r["side"], r["seed"]): r for r in kept["runs"]}
    for side, seed in todo:
        if side == "relax" and ("trl", seed) in kept_runs and ("trl", seed) not in todo \
                and not same_prompt_order(kept, kept_runs[("trl", seed)], kept_runs.get(("relax", seed))):
            raise SystemExit(f"relax:{seed} run again would leave the kept trl:{seed}, trained on the earlier Relax "
                             f"run's prompt order, which this run may not repeat: add trl:{seed}")
    for side, seed in todo:
        prompts = Path(a.work_dir) / f"relax-seed{seed}" / "trained_prompts.jsonl"
        if side == "trl" and ("relax", seed) not in todo and not prompts.exists():
            raise SystemExit(f"trl:{seed} trains on Relax seed {seed}'s prompt order, and {prompts} does not exist: "
                             f"add relax:{seed}")
    return kept, todo


#: the code that decides the ``uniform`` sampler's prompt order (a seeded shuffle of the rows)
ORDER_CODE = ("relax_core/data.py", "plugins/samplers/uniform")


def same_prompt_order(kept: dict, trl_run: dict, relax_run: dict | None) -> bool:
    """Whether Relax run again trains on the prompt order the kept TRL run trained on, so
    that the TRL run can be kept: either the TRL run recorded the order's hash (compared with
    the new Relax run's after it, :func:`check_kept_order`), or the kept Relax run's order
    could not depend on learning (the ``uniform`` sampler, no reward processor that drops
    groups) and the code deciding it (:data:`ORDER_CODE`) is the same at ``HEAD`` as at the
    kept race's commit."""
    if trl_run.get("prompt_order_sha256"):
        return True
    config = (relax_run or {}).get("config") or {}
    commit = kept.get("machine", {}).get("git commit", "")
    if config.get("sampler") != "uniform" or config.get("reward_processor") or not commit.isalnum():
        return False
    diff = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", commit, "HEAD", "--", *ORDER_CODE],
                          capture_output=True)
    return diff.returncode == 0


def order_hash(prompts: list[str]) -> str:
    """sha256 of a run's prompt sequence (one prompt per group, in order)."""
    import hashlib

    return hashlib.sha256(json.dumps(prompts).encode()).hexdigest()


def check_kept_order(new: dict, kept_trl: dict) -> None:
    """A Relax run done now beside a kept TRL run that recorded its order: the orders must be equal.

    Raises:
        RuntimeError: they differ (the pair would compare different prompts).
    """
    if kept_trl.get("prompt_order_sha256") not in (None, new["prompt_order_sha256"]):
        raise RuntimeError(f"Relax seed {new['seed']} trained on another prompt order than the kept TRL run")


def machine() -> dict:
    import platform

    import torch

    dist = sorted(TRL_PYTHON.parent.parent.glob("lib/python*/site-packages/trl-*.dist-info"))
    trl = dist[-1].name[4:-len(".dist-info")] if dist else "absent"
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    if subprocess.run([*git, "status", "--porcelain", "--untracked-files=no", "--", "benchmarks", "relax_core", "plugins"],
                      capture_output=True, text=True).stdout.strip():
        commit += " (uncommitted changes)"
    return {"date": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC", "git commit": commit,
            "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs, "
                       f"{'cuda ' + torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu'}",
            "versions": f"python {platform.python_version()}, torch {torch.__version__}, trl {trl}",
            "command": " ".join([Path(sys.executable).name, *sys.argv]), "load average at start": _load()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default", help="default (SmolLM2-135M-Instruct), tiny, or a model directory")
    ap.add_argument("--seeds", default=None, help="comma list; each seed runs Relax, then TRL (default 0,1,2; "
                                                   "with --keep: none besides --rerun)")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default: Relax's --num-rollout)")
    ap.add_argument("--save-every", type=int, default=2, help="steps between checkpoints (both sides)")
    ap.add_argument("--eval-prompts", type=int, default=None,
                    help="held-out prompts scored per checkpoint, the first ones (default: Relax's --eval-max-prompts)")
    ap.add_argument("--train-data", default=None, help="training rows (any --data source; default: the default task's)")
    ap.add_argument("--eval-data", default=None, help="the held-out set (any --data source; default: the default "
                                                      "task's evaluation set)")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                    help="bfloat16 autocast on both sides (default: where Relax's --bf16 default is on), or float32")
    ap.add_argument("--check-only", action="store_true", help="only the same-update check")
    ap.add_argument("--smoke", action="store_true", help="tiny model, 2 steps, 1 seed, tiny sizes")
    ap.add_argument("--out", default=None, help="results .md (default benchmarks/results/learning-race-<date>.md; "
                                                "with --smoke, nothing is written unless given)")
    ap.add_argument("--work-dir", default=None, help="keep the runs here (default: a temporary directory)")
    ap.add_argument("--keep", default=None, metavar="RESULTS.json",
                    help="an earlier race's .json: keep its runs, and run only --rerun's and --seeds' (in its --work-dir "
                         "where a TRL run needs its seed's Relax run)")
    ap.add_argument("--rerun", default=None, metavar="SIDE:SEED,...",
                    help="with --keep: run these again (e.g. trl:0, one disturbed by another job) or for the first time")
    ap.add_argument("--reason", default="", help="with --keep: why, printed in the results")
    # worker mode (internal)
    ap.add_argument("--worker", choices=("relax-update", "trl-update", "trl-race"))
    ap.add_argument("--model-dir")
    ap.add_argument("--out-dir")
    ap.add_argument("--rows")
    ap.add_argument("--work")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("relax_args", nargs="*", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        {"relax-update": relax_update_worker, "trl-update": trl_update_worker, "trl-race": trl_race_worker}[a.worker](a)
        return 0
    from relax_core.config import DEFAULT_DATA, DEFAULT_EVAL_DATA

    a.train_data, a.eval_data = a.train_data or DEFAULT_DATA, a.eval_data or DEFAULT_EVAL_DATA
    work = SMOKE_WORK if a.smoke else default_work()
    if not a.smoke:
        work = Work(**{**asdict(work), "steps": a.steps or work.steps, "save_every": a.save_every,
                       "eval_prompts": a.eval_prompts or work.eval_prompts,
                       "bf16": work.bf16 if a.bf16 is None else a.bf16})
    kept, rerun = rerun_plan(a)
    seeds = [0] if a.smoke else [int(s) for s in (a.seeds or "0,1,2").split(",")]
    if kept is not None:
        seeds = sorted({r["seed"] for r in kept["runs"]} | {s for _, s in rerun})
    model = "tiny" if a.smoke else a.model
    eval_source = a.eval_data
    has_trl = TRL_PYTHON.exists()
    if not has_trl and not a.smoke:
        print(f"TRL's venv is missing ({TRL_PYTHON}); create it with `make benchmarks/.envs/trl/bin/python`. "
              "The race needs both sides.", file=sys.stderr)
        return 2
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d")
    out = Path(a.out) if a.out else (None if a.smoke else HERE / "results" / f"learning-race-{stamp}.md")
    res = {"machine": machine(), "model": model, "work": asdict(work), "train_source": a.train_data,
           "eval_source": eval_source, "check": None, "runs": [], "base": None}
    if kept is not None:
        if ({"bf16": False, **kept["work"]}, kept["train_source"], kept["eval_source"], kept.get("model", model)) != \
                (res["work"], a.train_data, eval_source, model):
            print("--keep: that race ran another model, work or data than this one would; not mixing them",
                  file=sys.stderr)
            return 2
        res["reruns"] = {"of": kept["machine"], "runs": [f"{side} seed {s}" for side, s in sorted(rerun)],
                         "reason": a.reason}
    print("\n".join(f"{k}: {v}" for k, v in res["machine"].items()), flush=True)
    with tempfile.TemporaryDirectory(prefix="relax-race-") as tmp:
        wd = Path(a.work_dir or tmp)
        wd.mkdir(parents=True, exist_ok=True)
        mdir = model_path(model, wd)
        data = wd / "train.jsonl"
        res["data"] = write_training_rows(a.train_data, eval_source, data)
        rows = [json.loads(line) for line in data.read_text().splitlines()]
        if has_trl:
            res["check"] = same_update(mdir, rows, work, wd / "check")
            print("\n".join(check_section(res["check"])), flush=True)
            if not res["check"]["passed"]:
                print("the same-update check FAILED: the race would compare different maths; not racing", flush=True)
        else:
            print("TRL's venv is absent: the same-update check and TRL's side are NOT RUN (Relax only)", flush=True)
        if not a.check_only and (res["check"] is None or res["check"]["passed"]):
            res["base"] = base = held_out_accuracy(mdir, wd / "eval-base", eval_source, work, None)
            for seed in seeds:
                pair = []
                for side in ("relax", "trl") if has_trl else ("relax",):
                    if kept is None or (side, seed) in rerun:  # run now
                        pair.append(race_one(side, seed, mdir, data, rows, work, wd, eval_source, base["scorer"],
                                             wd / f"relax-seed{seed}" if side == "trl" else None))
                    else:  # kept from the earlier race (when it has that run)
                        pair += [r for r in kept["runs"] if (r["side"], r["seed"]) == (side, seed)]
                if len(pair) == 2 and kept is not None and ("relax", seed) in rerun and ("trl", seed) not in rerun:
                    check_kept_order(pair[0], pair[1])
                res["runs"] += pair
                if len(pair) == 2:
                    bad = knob_mismatches(pair[0]["config"], pair[1]["config"])
                    if bad:
                        raise RuntimeError("the two sides ran with different settings: " + "; ".join(bad))
    if any(r["side"] == "trl" for r in res["runs"]):
        res["summary"] = summary(res["runs"])
    text = report(res, a.smoke)
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        if out == Path(os.devnull):  # make bench: the output goes into the suite's results file
            return 0 if res["check"] is None or res["check"]["passed"] else 1
        out.write_text(text + f"\n![held-out accuracy against wall-clock seconds]({out.with_suffix('.png').name})\n")
        out.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str))
        if res["runs"]:
            plot(res["runs"], res["base"], out.with_suffix(".png"))
        print(f"results written to {out} (and its .png and .json)")
    return 0 if res["check"] is None or res["check"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
