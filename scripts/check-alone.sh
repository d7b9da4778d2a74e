#!/usr/bin/env bash
# Prove a workspace library installs and passes its own tests ALONE: build its wheel (and the wheels of the
# mcprl libraries it depends on), install them into a fresh venv outside the workspace with only pytest and
# hypothesis beside them, and run the package's tests against the installed wheel (not the source tree).
# Third-party versions are exactly uv.lock's (`uv sync --package`, no resolution), linked from uv's cache.
#
# usage: [EXTRAS=a,b] scripts/check-alone.sh PACKAGE [INTERNAL_DEP ...]
#   e.g. scripts/check-alone.sh mcprl-env mcprl-tools
#        EXTRAS=deepspeed scripts/check-alone.sh mcprl-train mcprl-grpo mcprl-tools ...
set -euo pipefail
pkg=$1; shift
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mcprl-alone-$pkg.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$root"
# Wheels built from the current source: uv's cache of a built workspace member is keyed on its pyproject.toml,
# not on its code, so the members are installed from these wheels, never from that cache.
for p in "$pkg" "$@"; do
  uv build --quiet --package "$p" --wheel --out-dir "$tmp/dist"
done
extras=()
for e in ${EXTRAS:+${EXTRAS//,/ }}; do extras+=(--extra "$e"); done
# The package's third-party dependencies as locked, no workspace member, no bytecode compiled up front (the
# tests compile what they import, once, into $tmp/pycache below).
UV_PROJECT_ENVIRONMENT="$tmp/venv" uv sync --quiet --locked --package "$pkg" "${extras[@]}" \
  --no-install-workspace --no-default-groups --no-compile-bytecode
uv pip install --quiet --no-compile-bytecode --python "$tmp/venv/bin/python" --no-deps "$tmp"/dist/*.whl
uv export --quiet --locked --all-packages --all-extras --no-emit-workspace --no-hashes --no-header \
  --format requirements-txt -o "$tmp/constraints.txt"
# vllm's pins would drag CUDA-only wheels into a constraints solve we do not need here.
grep -v -E '^(vllm|xformers|flashinfer)' "$tmp/constraints.txt" > "$tmp/c.txt"
uv pip install --quiet --no-compile-bytecode --python "$tmp/venv/bin/python" -c "$tmp/c.txt" \
  pytest hypothesis pytest-timeout
# Every installed wheel's declared requirements (the mcprl wheels' included) are met.
uv pip check --quiet --python "$tmp/venv/bin/python"
# The package must be imported from the wheel: run from a directory outside the workspace.
cd "$tmp"
pkg_mod=${pkg//-/_}
export PYTHONPYCACHEPREFIX="$tmp/pycache"
unset PYTHONDONTWRITEBYTECODE
"$tmp/venv/bin/python" -c "import $pkg_mod, sys; assert '$root' not in $pkg_mod.__file__, $pkg_mod.__file__; print('$pkg alone:', $pkg_mod.__file__)"
"$tmp/venv/bin/python" -m pytest "$root/packages/$pkg/tests" -q -p no:cacheprovider \
  --rootdir "$root" -c "$root/pyproject.toml" -m "not gpu and not vllm"
