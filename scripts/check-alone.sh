#!/usr/bin/env bash
# Prove a workspace library installs and passes its own tests ALONE: build its wheel (and the wheels of the
# mcprl libraries it depends on), install them into a fresh venv outside the workspace with only pytest and
# hypothesis beside them, and run the package's tests against the installed wheel (not the source tree).
# Versions are pinned to uv.lock (exported as constraints), so this reuses uv's cache instead of resolving anew.
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
for p in "$pkg" "$@"; do
  uv build --quiet --package "$p" --wheel --out-dir "$tmp/dist"
done
uv export --quiet --locked --all-packages --all-extras --no-emit-workspace --no-hashes --no-header \
  --format requirements-txt -o "$tmp/constraints.txt"
# vllm's pins would drag CUDA-only wheels into a constraints solve we do not need here.
grep -v -E '^(vllm|xformers|flashinfer)' "$tmp/constraints.txt" > "$tmp/c.txt"
uv venv --quiet --python 3.11 "$tmp/venv"
UV_COMPILE_BYTECODE=0 uv pip install --quiet --python "$tmp/venv/bin/python" --find-links "$tmp/dist" -c "$tmp/c.txt" \
  "$pkg${EXTRAS:+[$EXTRAS]}" pytest hypothesis pytest-timeout
# The package must be imported from the wheel: run from a directory outside the workspace.
cd "$tmp"
pkg_mod=${pkg//-/_}
"$tmp/venv/bin/python" -c "import $pkg_mod, sys; assert '$root' not in $pkg_mod.__file__, $pkg_mod.__file__; print('$pkg alone:', $pkg_mod.__file__)"
"$tmp/venv/bin/python" -m pytest "$root/packages/$pkg/tests" -q -p no:cacheprovider \
  --rootdir "$root" -c "$root/pyproject.toml" -m "not gpu and not vllm"
