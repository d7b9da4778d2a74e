#!/usr/bin/env bash
# Run mcprl's GPU checks on a machine with a CUDA GPU and no network: the `gpu`-marked tests, then a short
# `mcprl-train` per GPU profile on the real-template stand-in model. What the machine's Python lacks is
# installed offline from the folder scripts/fetch-gpu-wheels.py filled beforehand (default .gpu-wheels), into
# an overlay venv that sees the machine's packages (its torch is used, never reinstalled).
#
# usage: scripts/test-gpu.sh [--quick | --full] [--out DIR] [--wheels DIR] [--venv DIR]
#   --quick   (default) one GRPO step per profile (meant to fit a 10-minute call); --full: three, larger model
#   --out     results folder (default $OUT when set, else ./gpu-results): results.txt (one line per part and
#             the versions), log.txt (everything), gpu-tests.xml (junit), constraints.txt; the stand-in model
#             and the runs go to a temporary folder
# Exit status: 0 all parts passed or were skipped with a reason; 1 a part failed; 2 no CUDA device or a
# setup error (nothing ran).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
mode=quick
out=${OUT:-$root/gpu-results}
wheels=$root/.gpu-wheels
venv=/tmp/mcprl-gpu-venv
py=${PYTHON:-python3}
while [ $# -gt 0 ]; do
  case $1 in
    --quick) mode=quick ;;
    --full) mode=full ;;
    --out) out=$2; shift ;;
    --wheels) wheels=$2; shift ;;
    --venv) venv=$2; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "test-gpu: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

die() { echo "test-gpu: $*" >&2; exit 2; }

# No CUDA: say so at once, before anything is installed.
command -v nvidia-smi >/dev/null 2>&1 || die "no CUDA device: nvidia-smi is not on PATH (run this on a machine with an NVIDIA GPU and its driver)"
gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1) \
  || die "no CUDA device: nvidia-smi failed: $gpu"
cuda=$("$py" -c 'import torch; assert torch.cuda.is_available(), "torch.cuda.is_available() is False"; print(torch.__version__, torch.version.cuda)' 2>&1) \
  || die "no CUDA device usable by $py's torch: ${cuda##*$'\n'}"
[ -d "$wheels" ] || die "$wheels is missing: run scripts/fetch-gpu-wheels.py on a machine with network first"

mkdir -p "$out" || die "cannot create $out"
results=$out/results.txt
log=$out/log.txt
: >"$results"
: >"$log"
say() { echo "$*" | tee -a "$results"; }
failed=0

say "device: $gpu"
say "python: $("$py" -c 'import sys; print(sys.version.split()[0], sys.executable)') torch: $cuda"

# The overlay venv: the machine's site-packages come after its own through a .pth file.
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv --without-pip "$venv" >>"$log" 2>&1 || die "$py -m venv failed (see $log)"
fi
vpy=$venv/bin/python
"$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >"$out/.purelib" || die "the venv at $venv is broken"
# site.addsitedir (not a bare path) so that the machine's own .pth files are read too.
"$py" -c 'import site; print("".join(f"import site; site.addsitedir({p!r})\n" for p in site.getsitepackages()))' \
  >"$(cat "$out/.purelib")/machine-site.pth"
rm -f "$out/.purelib"
"$vpy" -c 'import torch, pip' 2>>"$log" || die "the venv at $venv does not see the machine's torch and pip"

# Keep the machine's model stack as it is; the wheels only add what is missing.
"$py" -m pip list --format=freeze 2>/dev/null \
  | grep -iE '^(torch|triton|numpy|transformers|tokenizers|accelerate|peft|safetensors)==' >"$out/constraints.txt"
pipi() { "$vpy" -m pip install --no-index --find-links "$wheels" --no-build-isolation --disable-pip-version-check \
  -c "$out/constraints.txt" "$@" >>"$log" 2>&1; }
train_extra=
ls "$wheels"/deepspeed-* >/dev/null 2>&1 && train_extra='[deepspeed]'
optional=()
ls "$wheels"/bitsandbytes-* >/dev/null 2>&1 && optional+=(bitsandbytes)
t0=$SECONDS
pipi hatchling editables || die "installing the build backend from $wheels failed: $(tail -n 3 "$log")"
pipi -e "$root/packages/mcprl-grpo" -e "$root/packages/mcprl-tools" -e "$root/packages/mcprl-env" \
  -e "$root/packages/mcprl-policy" -e "$root/apps/mcprl-servers" -e "$root/apps/mcprl-tasks" \
  -e "$root/packages/mcprl-train$train_extra" gguf pytest-timeout "${optional[@]}" \
  || die "offline install failed (a wheel for this Python missing? scripts/fetch-gpu-wheels.py --python $("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')): $(grep -E '^(ERROR|error)' "$log" | tail -n 3)"
[ "$("$vpy" -c 'import torch; print(torch.__file__)')" = "$("$py" -c 'import torch; print(torch.__file__)')" ] \
  || die "the install replaced the machine's torch"
say "install: ok $((SECONDS - t0)) s"
say "versions: $("$vpy" - <<'EOF'
import importlib.metadata as md
out = []
for name in ("torch", "transformers", "peft", "accelerate", "bitsandbytes", "deepspeed", "vllm", "mcp", "flash-attn"):
    try:
        out.append(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        out.append(f"{name} -")
print(", ".join(out))
EOF
)"

export MCPRL_CHAT_TEMPLATES_DIR=$wheels/chat-templates HF_HUB_OFFLINE=1 WANDB_MODE=disabled WEAVE_DISABLED=true \
  TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
cd "$root" || exit 2

# 1. The gpu-marked tests (only the files that hold some: the others may import what is not installed here).
mapfile -t gpu_files < <(grep -rlE 'pytest\.mark\.gpu|mark\.gpu' --include='test_*.py' packages apps tests | sort)
t0=$SECONDS
"$vpy" -m pytest -m gpu -q -p no:cacheprovider -o timeout=300 -rs \
  --junitxml "$out/gpu-tests.xml" "${gpu_files[@]}" >>"$log" 2>&1
status=$?
say "gpu_tests: $("$vpy" - "$out/gpu-tests.xml" <<'EOF'
import sys
import xml.etree.ElementTree as ET
try:
    suites = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError) as exc:
    print(f"no report ({exc})")
    raise SystemExit
suite = suites if suites.tag == "testsuite" else suites.find("testsuite")
n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
print(f"passed {n['tests'] - n['failures'] - n['errors'] - n['skipped']} failed {n['failures'] + n['errors']} skipped {n['skipped']}")
EOF
) ($((SECONDS - t0)) s, exit $status)"
[ $status -eq 0 ] || failed=1

# 2. A short mcprl-train per GPU profile on the stand-in (random weights, Qwen3 vocabulary and template).
if [ $mode = full ]; then hidden=256 layers=4 steps=3; else hidden=64 layers=2 steps=1; fi
work=$(mktemp -d "${TMPDIR:-/tmp}/mcprl-gpu.XXXXXX")  # the model and the runs stay out of --out (few, small files)
standin=$work/standin-model
"$vpy" - "$standin" "$hidden" "$layers" >>"$log" 2>&1 <<'EOF' || { say "standin: FAILED (see log.txt)"; failed=1; }
import os, sys
from pathlib import Path
from mcprl_policy.standin import qwen_tokenizer, save_standin_model
templates = Path(os.environ["MCPRL_CHAT_TEMPLATES_DIR"])
tokenizer = qwen_tokenizer(templates / "ggml-vocab-qwen2.gguf", release="qwen3",
                           chat_template=(templates / "Qwen-Qwen3-0.6B.jinja").read_text())
save_standin_model(Path(sys.argv[1]), tokenizer, hidden_size=int(sys.argv[2]), num_hidden_layers=int(sys.argv[3]))
EOF
short=(--set "model.name=$standin" --set run.seed=0 --set "run.steps=$steps"
  --set run.checkpoint_every=0 --set grpo.tasks_per_step=4 --set grpo.group_size=4 --set grpo.filter_zero_std=false
  --set eval.every=0 --set eval.n_tasks=2 --set env.max_new_tokens_per_turn=64 --set env.max_total_tokens=4096
  --set tracking.wandb=disabled --set tracking.progress=false)

runs=0
profile() {  # NAME LABEL [--set ...]: one line "profile LABEL: ok step_s=..." or "FAILED"
  local name=$1 label=$2; shift 2
  local dir=$work/runs t0=$SECONDS
  runs=$((runs + 1))
  local run=$name-$runs  # a profile may run twice (other settings): each run its own directory
  "$vpy" -m mcprl_train train --profile "$name" "${short[@]}" --set "run.output_dir=$dir" --run-name "$run" "$@" \
    >>"$log" 2>&1
  local status=$?
  local steps_line
  steps_line=$("$vpy" - "$dir/$run/metrics.jsonl" <<'EOF'
import json, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
except OSError:
    rows = []
grpo = [r for r in rows if r.get("kind") == "grpo"]
if grpo:
    last = grpo[-1]
    print(" ".join([f"steps={len(grpo)}"] + [f"{k.split('/')[-1]}={last[k]:.3g}" for k in
          ("perf/step_s", "perf/collect_s", "perf/learn_s", "perf/tokens_per_s", "rollout/valid_frac") if k in last]))
EOF
)
  if [ $status -eq 0 ] && [ -n "$steps_line" ]; then
    say "profile $label: ok $steps_line ($((SECONDS - t0)) s)"
  else
    say "profile $label: FAILED exit $status ($((SECONDS - t0)) s; see log.txt)"
    failed=1
  fi
}
if "$vpy" -c 'import bitsandbytes' >>"$log" 2>&1; then
  profile single-gpu-lora single-gpu-lora
else
  profile single-gpu-lora 'single-gpu-lora[quantization=null: bitsandbytes not installed]' --set quantization=null
fi
if "$vpy" -c 'import deepspeed' >>"$log" 2>&1; then
  profile a100x2 'a100x2[num_gpus=1, ZeRO-3 in one process]' --set distributed.num_gpus=1
else
  say "profile a100x2: skipped (deepspeed does not import; see log.txt)"
fi
if vllm_error=$("$vpy" -c 'import vllm' 2>&1); then
  profile vllm-gpu vllm-gpu
  profile vllm-gpu 'vllm-gpu[sampler.vllm_sleep=true]' --set sampler.vllm_sleep=true
  if "$vpy" -c 'import deepspeed' >>"$log" 2>&1; then
    profile a100x2 'a100x2[num_gpus=1, ZeRO-3, sampler.backend=vllm, vllm_sleep]' --set distributed.num_gpus=1 \
      --set sampler.backend=vllm --set sampler.vllm_sleep=true --set sampler.gpu_memory_utilization=0.3
  fi
else
  say "profile vllm-gpu: skipped (vllm does not import: ${vllm_error##*$'\n'})"
fi

say "result: $([ $failed -eq 0 ] && echo ok || echo FAILED) ($mode)"
exit $failed
