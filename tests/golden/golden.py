"""Golden runs: 4-step tiny-model runs of every estimator and correction (local, Ray sync,
Ray fully-async) whose ``metrics.jsonl`` was recorded before the core redesign (issue 17)
and must stay the same after it.

    python tests/golden/golden.py record [CASE ...]   # (re)write <DATA>/<case>.jsonl (below)
    python tests/golden/golden.py check  [CASE ...]   # compare, print the differences

Timing metrics (``perf/*``) are dropped; everything else is kept.  Every flag a later
change of defaults could move (prompt suffix, learning rate, seed, lengths) is given
explicitly, so that a golden file changes only when the maths or the loop does.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _cpu_kinds() -> list[str]:
    """The names of this CPU's kind, most specific first: ``<vendor_id>-<cpu family>-<model>``
    (e.g. ``AuthenticAMD-25-17``, AMD Zen 4 "Genoa"; family 25 also holds Zen 3, whose
    kernels round differently), ``<vendor_id>-<cpu family>`` (``AuthenticAMD-26``, Zen 5) and
    ``<vendor_id>`` (``GenuineIntel``, ``AuthenticAMD``) from /proc/cpuinfo; ``[]`` when it
    cannot be read."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        return []
    vendor, family, model = info.get("vendor_id"), info.get("cpu family"), info.get("model")
    if not vendor:
        return []
    if not family:
        return [vendor]
    return [*([f"{vendor}-{family}-{model}"] if model else []), f"{vendor}-{family}", vendor]


#: the recorded runs: ``data/<vendor>-<family>-<model>/``, ``data/<vendor>-<family>/`` or
#: ``data/<vendor>/``, the first recorded on
#: this kind of CPU (another vendor's or generation's kernels round differently, and the
#: sampled tokens of the tiny random model then diverge: two AMD EPYC generations do), else
#: ``data/`` (recorded before the core redesign, on the first development machine)
DATA = next((d for d in (HERE / "data" / k for k in _cpu_kinds()) if d.is_dir()), HERE / "data")
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

#: relative / absolute tolerance of the comparison: bit-equal on one machine; the
#: tolerance covers other CPUs' float reduction orders (Ray runs: see ``RAY_TOL``)
REL_TOL, ABS_TOL = 1e-5, 1e-7
RAY_TOL = 1e-4

#: the recordings are float32 runs: ``--no-bf16`` pins them on CPUs where bf16 is the default
BASE = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--global-batch-size", "8",
        "--rollout-max-response-len", "8", "--num-rollout", "4", "--lr", "1e-3", "--seed", "3",
        "--prompt-suffix", " Answer:", "--reward-num-workers", "1", "--quiet", "--wandb-mode", "disabled",
        "--no-save-hf", "--no-bf16", "--custom-rm-path", "golden_scorers:vowel_fraction"]

ESTIMATORS = ("grpo", "rloo", "ppo", "cispo", "gspo", "sapo", "m2po", "reinforce_plus_plus",
              "reinforce_plus_plus_baseline")

#: case name -> (extra flags, MoE model, Ray)
CASES: dict[str, tuple[list[str], bool, bool]] = {
    **{e: (["--config", f"examples/recipes/{e}.yaml"], False, False) for e in ESTIMATORS},
    "grpo_kl_entropy": (["--use-kl-loss", "--kl-loss-coef", "0.01", "--entropy-coef", "0.01"], False, False),
    "grpo_two_updates": (["--num-steps-per-rollout", "2", "--global-batch-size", "4", "--update-weights-interval", "2"], False, False),
    "tis": (["--correction", "tis"], False, False),
    "tis_geometric_reinforce": (["--correction", "tis", "--tis-level", "geometric", "--pg-loss-type", "reinforce"],
                                False, False),
    "icepop": (["--correction", "icepop", "--advantage-estimator", "rloo", "--calculate-per-token-loss"], False, False),
    "score_centering": (["--correction", "score_centering", "--correction", "tis", "--pg-loss-type", "reinforce",
                         "--score-centering-top-k", "8"], False, False),
    "routing_replay": (["--correction", "routing_replay"], True, False),
    "ray_sync": (["--launcher", "ray", "--correction", "tis"], False, True),
    "ray_async": (["--launcher", "ray", "--fully-async", "--max-staleness", "1"], False, True),
}


def _clean(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if not k.startswith("perf/")}


def run_case(name: str, work: Path) -> list[dict]:
    """Run case ``name`` in this process under ``work``; returns its cleaned metric rows.

    Raises:
        RuntimeError: the run did not exit 0 (its output is in the message)."""
    from typer.testing import CliRunner

    from cli.main import app
    from relax_authoring.testing.models import make_tiny_model

    flags, moe, _ = CASES[name]
    model = work / ("tiny-moe" if moe else "tiny")
    if not model.is_dir():
        make_tiny_model(model, moe=moe, seed=0)
    data = work / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + {i + 1}?", "label": str(2 * i + 1)}) + "\n"
                            for i in range(8)))
    root = HERE.parents[1]
    flags = [str(root / f) if f.startswith("examples/") else f for f in flags]
    args = ["train", *BASE, *flags, "--model", str(model), "--data", str(data), "--output-dir", str(work / "runs"),
            "--run-name", name]
    res = CliRunner().invoke(app, args)
    if res.exit_code != 0:
        raise RuntimeError(f"golden case {name} exited {res.exit_code}:\n{res.output}\n{res.exception!r}")
    lines = (work / "runs" / name / "metrics.jsonl").read_text().splitlines()
    return [_clean(json.loads(x)) for x in lines]


def differences(expected: list[dict], got: list[dict], tol: float = REL_TOL) -> list[str]:
    """Human-readable differences between two runs' cleaned metric rows (empty = equal)."""
    out = []
    if len(expected) != len(got):
        return [f"{len(got)} rows, expected {len(expected)}"]
    for e, g in zip(expected, got):
        step = e.get("step")
        for k in sorted(set(e) | set(g)):
            if k not in g:
                out.append(f"step {step}: {k} missing")
            elif k not in e:
                out.append(f"step {step}: {k} is new ({g[k]})")
            elif isinstance(e[k], float) and isinstance(g[k], (int, float)):
                if not math.isclose(e[k], g[k], rel_tol=tol, abs_tol=ABS_TOL):
                    out.append(f"step {step}: {k} = {g[k]!r}, expected {e[k]!r}")
            elif e[k] != g[k]:
                out.append(f"step {step}: {k} = {g[k]!r}, expected {e[k]!r}")
    return out


def _ensure_ray() -> None:
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if not ray.is_initialized():
        ray.init(num_cpus=3, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)


def main(argv: list[str]) -> int:
    mode, names = argv[0], argv[1:] or list(CASES)
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            if CASES[name][2]:
                _ensure_ray()
            got = run_case(name, Path(tmp))
            path = DATA / f"{name}.jsonl"
            if mode == "record":
                DATA.mkdir(exist_ok=True)
                path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in got))
                print(f"recorded {path.relative_to(HERE.parents[1])} ({len(got)} rows)")
            else:
                expected = [json.loads(x) for x in path.read_text().splitlines()]
                diff = differences(expected, got, RAY_TOL if CASES[name][2] else REL_TOL)
                bad += bool(diff)
                print(f"{name}: {'ok' if not diff else 'DIFFERS'}")
                for d in diff[:20]:
                    print(f"  {d}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
