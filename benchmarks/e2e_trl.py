"""End to end: Relax (``relax train``'s code path) against TRL's ``GRPOTrainer``, the same work,
step for step, in one invocation.

Both sides run as long-lived worker processes (Relax in ``.venv``, TRL in its own venv
``benchmarks/.envs/trl``), load the same model directory once, and then wait at the start of
every training step for a ``go`` from this driver.  The driver alternates them step by step
(A B, B A, A B, ...), so both see the same machine load; the first step of each side is a
warm-up (Relax starts its reward workers there, both sides touch their buffers for the first
time) and is not counted.  Each step reports its wall time, the generation part, the
generated and trained tokens and the process's peak RSS.

How the two are made to do the same work (one update per rollout, same precision, no KL,
same loss reduction):

=======================  =========================================  =============================================
setting                  Relax (``relax train`` flags)              TRL ``GRPOConfig``
=======================  =========================================  =============================================
model, dtype             same HF directory, float32 weights;        same directory, ``bf16`` as Relax's
                         ``--bf16`` (autocast) where Relax's default
                         is bfloat16 (``--no-bf16`` of this script:
                         float32 on both)
prompts                  same JSONL rows, chat template,            same rows as conversational prompts (chat
                         ``--prompt-suffix ''``                     template applied by TRL)
batch                    ``--rollout-batch-size P``                 ``per_device_train_batch_size = P·G``,
                         ``--n-samples-per-prompt G``               ``num_generations = G``, grad. accumulation 1
updates per rollout      1 (``--num-steps-per-rollout 1``)          ``steps_per_generation = 1``, ``num_iterations = 1``
old log-probs            detach(current) (no extra forward)         none computed (aligned steps): detach(current)
sampling                 T = 1, top-p 1, no top-k, max L tokens     ``temperature 1, top_p 1, top_k 0``, max L
reward                   ``--custom-rm-path e2e_reward:score``      ``e2e_reward.trl_reward`` (same function)
advantage                GRPO, group mean / (std + 1e-6)            ``scale_rewards="group"`` (std + 1e-4)
loss                     PPO-clip ε = 0.2, seq-mean-token-mean      ``epsilon 0.2``, ``loss_type="grpo"`` (same mean)
KL / entropy bonus       none (``kl_coef 0``, no KL loss)           ``beta = 0`` (no reference model)
optimizer                AdamW lr 1e-6, wd 0, clip 1.0, constant    ``adamw_torch`` lr 1e-6, wd 0, max_grad_norm 1,
                                                                    ``lr_scheduler_type="constant"``
activations              selective checkpointing (exact, default)   ``gradient_checkpointing=False`` (TRL default True)
threads                  ``torch.set_num_threads(--threads)``       the same
=======================  =========================================  =============================================

Remaining differences, by design of each tool: Relax samples with its rollout engine (the
``hf`` engine, which also returns per-token log-probs) and copies the new weights into it
after each step; TRL samples with the training model itself.  Relax scores in its reward
worker pool (2 processes, per-call timeouts); TRL calls the reward function in-process.  The
transformers version is the same on both sides (5.19.0).

Metrics, each the median over the counted steps of that step's value: seconds per step
(wall; CPU seconds of the trainer process beside it: on a shared machine it moves less with
the load), generated tokens/s (generated tokens / generation seconds), trained tokens/s
(response tokens in the loss / step seconds); then the generation share of the step time,
peak RSS of the trainer process (``VmHWM``; Relax's reward workers are separate processes,
their RSS is reported apart), and the load time (process start to the first step, model and
tokenizer loading included; the two sides load one after the other).  Ratios: of the
medians, and the *paired* ratio (the median over i of Relax's trained tokens/s in its i-th
counted step over TRL's in its i-th: the two ran back to back, so each pair saw the same load).

Batch and counted steps per model (``BATCH``): tiny Qwen3 2 prompts × 8 samples × ≤ 64 new
tokens, 5 counted steps per side; SmolLM2 2 × 4 × ≤ 48, 3 counted steps per side; one warm-up
step each.  Sized for the 20-minute budget of ``make bench``: 2.0 minutes at load average
0.5–1.6; with 6 + 4 counted steps it took 13 minutes at load 4–7 (other engineers' jobs: a
SmolLM2 step took 7 s to 100 s depending on them).

Run:  .venv/bin/python benchmarks/e2e_trl.py [--models tiny,smollm2] [--steps N] [--smoke]
The TRL venv:  python3 -m venv benchmarks/.envs/trl &&
               benchmarks/.envs/trl/bin/pip install torch==2.13.0 trl transformers==5.19.0
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TRL_PYTHON = HERE / ".envs" / "trl" / "bin" / "python"
TAG = "@@bench "


# --------------------------------------------------------------------------- matched settings


def matched_relax_flags(*, model: str, data: str, prompts: int, group: int, max_new: int, lr: float,
                        temperature: float, seed: int, bf16: bool) -> list[str]:
    """``relax train`` flags of the matched work (the table above, Relax's column): ``prompts``
    prompts × ``group`` samples per step, at most ``max_new`` new tokens, learning rate ``lr``,
    sampling ``temperature``, bfloat16 autocast or float32 (``bf16``); the rows of the JSONL file ``data`` as they are, scored by
    ``e2e_reward:score`` (``benchmarks/`` on ``PYTHONPATH``).  ``benchmarks/learning_race.py``
    uses the same."""
    return ["--model", model, "--data", data, "--prompt-suffix", "", "--custom-rm-path", "e2e_reward:score",
            "--rollout-batch-size", str(prompts), "--n-samples-per-prompt", str(group),
            "--rollout-max-response-len", str(max_new), "--num-steps-per-rollout", "1", "--lr", str(lr),
            "--lr-warmup-steps", "0", "--weight-decay", "0", "--clip-grad", "1.0", "--eps-clip", "0.2",
            "--eps-clip-high", "0.2", "--loss-reduction", "seq-mean-token-mean", "--kl-loss-coef", "0",
            "--entropy-coef", "0", "--rollout-temperature", str(temperature), "--rollout-top-p", "1.0",
            "--rollout-top-k", "-1", "--adam-beta1", "0.9", "--adam-beta2", "0.999", "--adam-eps", "1e-8",
            "--seed", str(seed), "--bf16" if bf16 else "--no-bf16"]


def matched_grpo_config(*, prompts: int, group: int, max_new: int, lr: float, temperature: float,
                        seed: int, bf16: bool) -> dict:
    """``GRPOConfig`` keyword arguments of the same work (the table above, TRL's column), to
    which the caller adds ``output_dir``, ``max_steps``, the save strategy and the device."""
    return dict(
        per_device_train_batch_size=prompts * group, gradient_accumulation_steps=1, num_generations=group,
        max_completion_length=max_new, temperature=temperature, top_p=1.0, top_k=0, repetition_penalty=1.0,
        learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, optim="adamw_torch",
        beta=0.0, num_iterations=1, steps_per_generation=1, epsilon=0.2, epsilon_high=0.2, loss_type="grpo",
        scale_rewards="group", mask_truncated_completions=False, bf16=bf16, gradient_checkpointing=False,
        logging_steps=1, report_to="none", seed=seed, disable_tqdm=True, dataloader_num_workers=0,
        log_completions=False)


# --------------------------------------------------------------------------- worker protocol


def _emit(obj: dict) -> None:
    sys.stdout.write(TAG + json.dumps(obj) + "\n")
    sys.stdout.flush()


def _gate() -> None:
    """Tell the driver this side is at the start of a step; wait for ``go`` (or quit)."""
    _emit({"event": "ready"})
    cmd = sys.stdin.readline().strip()
    if cmd != "go":
        sys.stdout.flush()
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            ray.shutdown()  # stop the local cluster this worker started
        os._exit(0)  # skip the final checkpoint / teardown: nothing after the last step is timed


def _peak_rss_mb() -> float:
    """Peak RSS of this process (``VmHWM``; not ``ru_maxrss``, which Linux carries over
    from the forking parent across ``exec``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _children_rss_mb() -> float:
    total = 0
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                for line in Path(f"/proc/{child}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            except OSError:
                pass
    return total / 1024


def relax_worker(a: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(a.threads)
    from relax_core import trainer as tr
    from relax_core.config import build_config, parse_cli
    from relax_core.host.plugins import load_registry
    from relax_core.host.validation import resolve
    from relax_core.run.launch import launch

    flags = [*matched_relax_flags(model=a.model_dir, data=a.data, prompts=a.prompts, group=a.group,
                                  max_new=a.max_new, lr=1e-6, temperature=1.0, seed=0, bf16=a.bf16),
             "--num-rollout", str(a.total_steps + 1), "--output-dir", a.out_dir, "--run-name", "relax",
             "--device", "cpu", *a.relax_flags.split()]
    reg = load_registry()
    schemas = reg.param_schemas()
    cli, _, _ = parse_cli(flags, schemas)
    cfg = build_config(cli=cli, param_schemas=schemas)
    resolved, problems = resolve(cfg, reg)
    if problems:
        raise SystemExit("relax config problems: " + "; ".join(map(str, problems)))
    step_fn = tr.Trainer.step

    def gated_step(self, step):
        _gate()
        t0, c0 = time.perf_counter(), time.process_time()
        m = step_fn(self, step)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        tokens = m["rollout/response_len/mean"] * m["rollout/num_samples"]
        _emit({"event": "step", "seconds": dt, "cpu_seconds": cpu, "gen_seconds": m["perf/rollout_time"], "gen_tokens": tokens,
               "trained_tokens": tokens, "rss_mb": _peak_rss_mb(), "helpers_rss_mb": _children_rss_mb(),
               "reward": m.get("rollout/raw_reward")})
        return m

    tr.Trainer.step = gated_step
    launch(cfg, resolved, reg)


def trl_worker(a: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(a.threads)
    import e2e_reward
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = [json.loads(line) for line in Path(a.data).read_text().splitlines() if line.strip()]
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}], "label": r["label"]} for r in rows])
    args = GRPOConfig(**matched_grpo_config(prompts=a.prompts, group=a.group, max_new=a.max_new, lr=1e-6,
                                            temperature=1.0, seed=0, bf16=a.bf16),
                      output_dir=a.out_dir, max_steps=a.total_steps + 1, save_strategy="no", use_cpu=True)
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(a.model_dir)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    timing = {"gen": 0.0, "tokens": 0}

    class Gate(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            _gate()
            timing.update(gen=0.0, tokens=0, t0=time.perf_counter(), c0=time.process_time())

        def on_step_end(self, args, state, control, **kw):
            dt, cpu = time.perf_counter() - timing["t0"], time.process_time() - timing["c0"]
            _emit({"event": "step", "seconds": dt, "cpu_seconds": cpu, "gen_seconds": timing["gen"], "gen_tokens": timing["tokens"],
                   "trained_tokens": timing["tokens"], "rss_mb": _peak_rss_mb(), "helpers_rss_mb": _children_rss_mb(),
                   "reward": timing.get("reward")})

    trainer = GRPOTrainer(model=model, reward_funcs=e2e_reward.trl_reward, args=args, train_dataset=ds,
                          processing_class=tok, callbacks=[Gate()])
    generate, score = trainer._generate, trainer._generate_and_score_completions

    def timed_generate(*args, **kw):
        t0 = time.perf_counter()
        out = generate(*args, **kw)
        timing["gen"] += time.perf_counter() - t0
        return out

    def counted(*args, **kw):
        out = score(*args, **kw)
        timing["tokens"] += int(out["completion_mask"].sum())
        return out

    trainer._generate, trainer._generate_and_score_completions = timed_generate, counted
    trainer.train()


# --------------------------------------------------------------------------- driver


class Side:
    def __init__(self, name: str, cmd: list[str], env: dict, log: Path) -> None:
        self.name = name
        self.log = log.open("w")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, env=env, cwd=str(ROOT))
        self.t_start = time.perf_counter()

    def read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(TAG):
                return json.loads(line[len(TAG):])
        raise RuntimeError(f"{self.name} worker exited (code {self.proc.wait()}); see {self.log.name}")

    def send(self, cmd: str) -> None:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        try:
            self.send("quit")
        except (BrokenPipeError, OSError):
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def write_prompts(path: Path, n: int = 64) -> None:
    rng = random.Random(0)
    with path.open("w") as f:
        for _ in range(n):
            x, y = rng.randint(10, 99), rng.randint(10, 99)
            f.write(json.dumps({"prompt": f"Solve step by step: what is {x} + {y}? End with the final number.",
                                "label": str(x + y)}) + "\n")


def model_dir(kind: str, work: Path) -> str:
    from relax_authoring.testing.models import make_tiny_model
    from relax_core.models import ensure_default_model

    if kind == "smollm2":
        return str(ensure_default_model())
    return str(make_tiny_model(work / "tiny-qwen3", seed=0))


#: (prompts, samples per prompt, max new tokens, counted steps) per model; --prompts/--group/
#: --max-new/--steps override.
BATCH = {"tiny": (2, 8, 64, 5), "smollm2": (2, 4, 48, 3)}


def compare(kind: str, a: argparse.Namespace, work: Path) -> dict:
    a = argparse.Namespace(**vars(a))
    p, g, n, k = BATCH[kind]
    a.prompts, a.group, a.max_new, a.steps = a.prompts or p, a.group or g, a.max_new or n, a.steps or k
    mdir = model_dir(kind, work)
    data = work / "prompts.jsonl"
    write_prompts(data)
    total = a.warmup + a.steps
    env = {**os.environ, "PYTHONPATH": str(HERE), "OMP_NUM_THREADS": str(a.threads), "TOKENIZERS_PARALLELISM": "false",
           "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    common = ["--model-dir", mdir, "--data", str(data), "--prompts", str(a.prompts), "--group", str(a.group),
              "--max-new", str(a.max_new), "--total-steps", str(total), "--threads", str(a.threads),
              "--bf16" if a.bf16 else "--no-bf16"]
    cmds = {"relax": [sys.executable, __file__, "--worker", "relax", "--out-dir", str(work / "relax"), *common],
            "trl": [str(TRL_PYTHON), __file__, "--worker", "trl", "--out-dir", str(work / "trl"), *common]}
    sides: dict[str, Side] = {}
    results: dict[str, list[dict]] = {"relax": [], "trl": []}
    load = {}
    try:
        for name, cmd in cmds.items():  # one at a time, so that each load time is its own
            s = sides[name] = Side(name, cmd, env, work / f"{kind}-{name}.log")
            msg = s.read()
            assert msg["event"] == "ready", msg
            load[name] = time.perf_counter() - s.t_start
        for step in range(total):
            order = ["relax", "trl"] if step % 2 == 0 else ["trl", "relax"]
            for name in order:
                s = sides[name]
                s.send("go")
                r = s.read()
                assert r["event"] == "step", r
                results[name].append(r)
                print(f"  {kind} step {step} {name}: {r['seconds']:.2f} s, {r['trained_tokens']:.0f} tokens", flush=True)
                if step < total - 1:
                    assert s.read()["event"] == "ready"
    finally:
        for s in sides.values():
            s.close()
    return summarise(kind, results, load, a.warmup, [a.prompts, a.group, a.max_new])


def summarise(kind: str, results: dict[str, list[dict]], load: dict[str, float], warmup: int, batch: list[int]) -> dict:
    """Per side, the medians over the counted steps (``rows[warmup:]``) of the per-step
    values, and the paired ratio: the median over i of Relax's trained tokens/s in its i-th
    counted step over TRL's in its i-th (the two ran back to back)."""
    rate = {name: [r["trained_tokens"] / r["seconds"] for r in rows[warmup:]] for name, rows in results.items()}
    summary = {"model": kind, "load_s": load, "batch": batch, "warmup": warmup, "counted": len(rate["relax"]),
               "paired_trained_ratio": statistics.median(x / y for x, y in zip(rate["relax"], rate["trl"]))}
    for name, rows in results.items():
        counted = rows[warmup:]
        summary[name] = {
            "s_per_step": statistics.median(r["seconds"] for r in counted),
            "cpu_s_per_step": statistics.median(r["cpu_seconds"] for r in counted),
            "gen_tok_s": statistics.median(r["gen_tokens"] / r["gen_seconds"] for r in counted),
            "trained_tok_s": statistics.median(rate[name]),
            "tokens_per_step": statistics.mean(r["trained_tokens"] for r in counted),
            "gen_share": sum(r["gen_seconds"] for r in counted) / sum(r["seconds"] for r in counted),
            "peak_rss_mb": max(r["rss_mb"] for r in rows),
            "helpers_rss_mb": max(r["helpers_rss_mb"] for r in rows),
            "steps": [round(r["seconds"], 2) for r in rows],
        }
    return summary


def report(summaries: list[dict], a: argparse.Namespace) -> str:
    lines = [f"{'model':<9}{'side':<7}{'s/step':>8}{'CPU s':>7}{'gen tok/s':>11}{'trained tok/s':>15}{'tokens/step':>13}"
             f"{'gen share':>11}{'peak RSS MB':>13}{'helpers MB':>12}{'load s':>8}"]
    for s in summaries:
        for side in ("relax", "trl"):
            r = s[side]
            lines.append(f"{s['model']:<9}{side:<7}{r['s_per_step']:>8.2f}{r['cpu_s_per_step']:>7.2f}"
                         f"{r['gen_tok_s']:>11.0f}{r['trained_tok_s']:>15.0f}"
                         f"{r['tokens_per_step']:>13.0f}{r['gen_share']:>10.0%}{r['peak_rss_mb']:>13.0f}"
                         f"{r['helpers_rss_mb']:>12.0f}{s['load_s'][side]:>8.1f}")
        rx, tx = s["relax"], s["trl"]
        lines.append(f"{s['model']:<9}{'ratio':<7}{tx['s_per_step'] / rx['s_per_step']:>7.2f}x"
                     f"{tx['cpu_s_per_step'] / rx['cpu_s_per_step']:>6.2f}x"
                     f"{rx['gen_tok_s'] / tx['gen_tok_s']:>10.2f}x{rx['trained_tok_s'] / tx['trained_tok_s']:>14.2f}x"
                     f"   (>1 means Relax is faster: TRL/Relax for s and CPU s, Relax/TRL for tokens/s)")
    lines.append("")
    for s in summaries:
        p, g, n = s["batch"]
        lines.append(f"{s['model']}: {p} prompts × {g} samples, max {n} new tokens; {s['warmup']} warm-up + "
                     f"{s['counted']} counted steps per side, alternated; paired trained tok/s ratio (median over "
                     f"back-to-back steps) {s['paired_trained_ratio']:.2f}x")
        for side in ("relax", "trl"):
            lines.append(f"  {side} step seconds (warm-up first): {s[side]['steps']}")
    lines.append(f"{a.threads} torch threads per side; {'bfloat16 autocast' if a.bf16 else 'float32'} on both sides")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,smollm2", help="comma list of tiny, smollm2")
    ap.add_argument("--steps", type=int, default=None, help="counted steps per side after the warm-up "
                                                              "(default: per model, see BATCH)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=None, help="prompts per step (default: per model, see BATCH)")
    ap.add_argument("--group", type=int, default=None, help="samples per prompt (default: per model)")
    ap.add_argument("--max-new", type=int, default=None, help="max new tokens (default: per model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="tiny model, 1 prompt × 2 samples × 8 tokens, 1 step")
    ap.add_argument("--json", default=None, help="also write the summaries to this file")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                    help="bfloat16 autocast on both sides (default: where Relax's --bf16 default is on, "
                         "relax_core.run.precision), or float32 on both")
    # worker mode (internal)
    ap.add_argument("--worker", choices=("relax", "trl"))
    ap.add_argument("--model-dir")
    ap.add_argument("--data")
    ap.add_argument("--out-dir")
    ap.add_argument("--total-steps", type=int)
    ap.add_argument("--relax-flags", default="", help="extra `relax train` flags for the relax worker")
    a = ap.parse_args()
    if a.worker:
        (relax_worker if a.worker == "relax" else trl_worker)(a)
        return
    if a.smoke:
        a.models, a.steps, a.warmup, a.prompts, a.group, a.max_new = "tiny", 1, 1, 1, 2, 8
    if a.bf16 is None:
        from relax_core.config import RunConfig
        from relax_core.run.precision import resolve_bf16

        a.bf16 = resolve_bf16(RunConfig(device="cpu"))[0].bf16
    if not TRL_PYTHON.exists():
        print(f"TRL environment missing ({TRL_PYTHON}); create it with:\n  python3 -m venv benchmarks/.envs/trl && "
              "benchmarks/.envs/trl/bin/pip install torch==2.13.0 trl transformers==5.19.0\nend to end vs TRL: NOT MEASURED")
        return
    trl_version = subprocess.run([str(TRL_PYTHON), "-c", "import trl, transformers; print(trl.__version__, transformers.__version__)"],
                                 capture_output=True, text=True).stdout.split()
    import torch
    import transformers

    print(f"end to end vs TRL: torch {torch.__version__}, transformers {transformers.__version__} (relax) / "
          f"{trl_version[1] if len(trl_version) > 1 else '?'} (trl), trl {trl_version[0] if trl_version else '?'}, "
          f"python {platform.python_version()}, {os.cpu_count()} cores, load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    summaries = []
    with tempfile.TemporaryDirectory(prefix="relax-e2e-") as tmp:
        for kind in a.models.split(","):
            summaries.append(compare(kind.strip(), a, Path(tmp)))
    text = report(summaries, a)
    print(text)
    if a.json:
        Path(a.json).write_text(json.dumps(summaries, indent=2))


if __name__ == "__main__":
    main()
