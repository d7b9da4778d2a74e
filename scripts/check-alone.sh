#!/usr/bin/env bash
# Prove a workspace library installs and passes its own tests ALONE: build its wheel (and the wheels of the
# mcprl libraries it depends on), install them into a fresh venv outside the workspace with only pytest and
# hypothesis beside them, import every module of the installed wheel, and run the package's fast tests against
# it (not the source tree). Third-party versions are exactly uv.lock's (`uv sync --package`, no resolution),
# linked from uv's cache.
#
# What installing alone can break is an import: a module or a code path needing a distribution the library
# does not declare. Every module is imported here, and the fast tests reach the code paths; the `slow` tests
# are longer runs of the same code (already run by the workspace suite) and were measured to reach no
# distribution the fast ones do not, beyond torch's own (benchmarks/RESULTS.md, "CI time, second pass"), so
# they are deselected. ALONE_MARKERS overrides the selection (e.g. ALONE_MARKERS="not gpu and not vllm").
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
export PYTHONPYCACHEPREFIX="$tmp/pycache"
unset PYTHONDONTWRITEBYTECODE
# Every module imported, then the tests in the same process (they reuse those imports: torch & co. load once).
"$tmp/venv/bin/python" - "$pkg" "$root" "${ALONE_MARKERS:-not gpu and not vllm and not slow}" <<'EOF'
import importlib, pkgutil, sys
import pytest
dist, root, markers = sys.argv[1:]
name = dist.replace("-", "_")
pkg = importlib.import_module(name)
assert root not in pkg.__file__, f"{name} imported from the workspace: {pkg.__file__}"
modules = [m.name for m in pkgutil.walk_packages(pkg.__path__, f"{name}.") if not m.name.endswith(".__main__")]
for module in modules:
    importlib.import_module(module)
print(f"{name} alone: {pkg.__file__}, {len(modules)} modules imported")
args = [f"{root}/packages/{dist}/tests", "-q", "-p", "no:cacheprovider", "--rootdir", root]
sys.exit(pytest.main([*args, "-c", f"{root}/pyproject.toml", "-m", markers]))
EOF
