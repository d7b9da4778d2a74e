#!/usr/bin/env python3
"""Download what a GPU machine without network lacks to run mcprl into ``.gpu-wheels/`` (ignored by git).

The folder travels with the checkout (the device tool's ``carry``, 64 MiB for the whole tree) and
``scripts/test-gpu.sh`` installs from it with ``pip install --no-index --find-links``. What to fetch is computed,
not listed: the closure of the workspace members' dependencies in ``uv.lock`` (with the ``qlora`` and
``deepspeed`` extras and the test group) minus the closure of what the machine has (``MACHINE_HAS``, from
``../shared/PLATFORM.md`` "A GPU machine", or ``--have``). Each distribution is fetched at its locked version as
a wheel for every ``--python`` (manylinux x86_64), or as its sdist where the lock has no wheel (deepspeed; it is
built there against the machine's torch). Optional backends go last and are left out, with a line saying so,
when they do not fit ``--budget-mib``. The chat templates and the Qwen vocabulary (scripts/fetch-chat-templates.py)
are copied to ``.gpu-wheels/chat-templates/`` so the stand-in model builds there.

usage: scripts/fetch-gpu-wheels.py [--dir DIR] [--python 3.11 ...] [--have NAME ...] [--budget-mib N] [--plan]
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Required, TypedDict

from packaging.markers import Marker
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT / ".gpu-wheels"

MACHINE_HAS = (
    "torch",
    "transformers",
    "peft",
    "accelerate",
    "anyio",
    "attrs",
    "httpx",
    "jinja2",
    "pytest",
    "hypothesis",
    "rich",
    "numpy",
    "safetensors",
    "tokenizers",
)
"""What ../shared/PLATFORM.md says the GPU machine's Python has. Only named distributions count as present: their
dependencies are whatever the machine's versions brought, which the lock does not know, so a dependency of a
fetched distribution is fetched too unless it is named here."""

EXTRAS = ("qlora", "deepspeed")
"""Extras of the members fetched; ``vllm`` (hundreds of MB) cannot travel and ``tracking`` (wandb) is off there."""

TEST_GROUP = "test"
"""The root's dependency group the tests need (gguf for the stand-in's vocabulary, pytest-timeout for the config)."""

CANNOT_TRAVEL = {
    "vllm": "hundreds of MB of wheels (and a torch pin of its own): the vllm-gpu profile runs where vllm is installed",
    "wandb": "tracking only; the runs there use tracking.wandb=disabled",
    "weave": "tracking only; WEAVE_DISABLED=true there",
}
"""Distributions the code imports (lazily) that are never fetched, and why (tests/test_gpu_scripts.py reads it)."""

OPTIONAL = ("bitsandbytes", "deepspeed")
"""Backends fetched last: a test or profile that needs one reports a skip when it did not fit."""

BUILD = ("hatchling==1.33.0", "editables==0.6")
"""The members' build backend and what its editable installs need, for ``pip install --no-build-isolation -e``
there (fetched with their dependencies)."""

PYTHONS = ("3.11",)
"""PLATFORM.md's Python. The device tool's image has 3.12.3 (fetch-gpu-wheels.device-image.txt): pass
``--python 3.12``; both at once do not fit 64 MiB with matplotlib and pillow fetched."""

MANYLINUX = (
    *(f"manylinux_2_{n}_x86_64" for n in range(17, 40)),
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)

TEMPLATES = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mcprl" / "chat-templates"


@dataclass(frozen=True)
class Dist:
    """One locked distribution to fetch."""

    name: str
    version: str
    has_wheels: bool
    wheel_bytes: int
    """Bytes of the distinct wheels the wanted Pythons need (linux x86_64 or pure), from the lock's sizes."""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _marker_holds(marker: str | None, python: str) -> bool:
    if marker is None:
        return True

    env = {
        "sys_platform": "linux",
        "platform_machine": "x86_64",
        "platform_system": "Linux",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "python_version": python,
        "python_full_version": f"{python}.0",
    }
    return Marker(marker).evaluate(env)


class DepEntry(TypedDict, total=False):
    """A dependency as uv.lock writes it."""

    name: Required[str]
    version: str
    marker: str
    extra: list[str]


Lock = dict[str, list[dict[str, object]]]
"""uv.lock's packages by normalised name (a name appears once per locked version)."""


def _deps(
    package: dict[str, object], extras: tuple[str, ...], python: str, *, only_optional: bool = False
) -> list[DepEntry]:
    entries: list[DepEntry] = [] if only_optional else list(package.get("dependencies", []))  # type: ignore[arg-type]
    optional: dict[str, list[DepEntry]] = package.get("optional-dependencies", {})  # type: ignore[assignment]
    for extra in extras:
        entries += optional.get(extra, [])
    return [e for e in entries if _marker_holds(e.get("marker"), python)]


def _resolve(lock: Lock, entry: DepEntry) -> dict[str, object]:
    name = _norm(entry["name"])
    versions = lock.get(name)
    if not versions:
        raise SystemExit(f"fetch-gpu-wheels: {name} is not in uv.lock (run `uv lock`)")
    if "version" in entry:
        versions = [p for p in versions if p["version"] == entry["version"]]
    if len(versions) != 1:
        raise SystemExit(f"fetch-gpu-wheels: uv.lock has {len(versions)} matching versions of {name}")
    return versions[0]


def _closure(
    lock: Lock, roots: list[DepEntry], extras: tuple[str, ...], python: str, stop: frozenset[str]
) -> dict[str, dict[str, object]]:
    """The locked packages ``roots`` need on ``python`` (by name), not entering the names in ``stop``.

    ``extras`` apply to every package (the members'); an entry's own ``extra`` (``pyjwt[crypto]``) to its package.
    """
    seen: dict[str, dict[str, object]] = {}
    expanded: set[tuple[str, str]] = set()
    todo: list[DepEntry] = list(roots)
    while todo:
        entry = todo.pop()
        name = _norm(entry["name"])
        if name in stop:
            continue
        wanted = entry.get("extra", [])
        if name not in seen:
            seen[name] = _resolve(lock, entry)
            todo += _deps(seen[name], extras, python)
        for extra in wanted:
            if (name, extra) not in expanded:
                expanded.add((name, extra))
                todo += _deps(seen[name], (extra,), python, only_optional=True)
    return seen


@functools.cache
def _supported(python: str) -> frozenset[Tag]:
    version = tuple(int(p) for p in python.split("."))
    return frozenset(
        (*cpython_tags(version, platforms=MANYLINUX), *compatible_tags(version, platforms=MANYLINUX))
    )


def _wheel_fits(filename: str, python: str) -> bool:
    return not _supported(python).isdisjoint(parse_wheel_filename(filename)[3])


def plan(pythons: tuple[str, ...], have: tuple[str, ...]) -> list[Dist]:
    """The distributions the machine lacks, at their locked versions (optional backends last)."""
    raw = tomllib.loads((ROOT / "uv.lock").read_text())
    lock: Lock = {}
    for package in raw["package"]:
        lock.setdefault(_norm(package["name"]), []).append(package)
    members = {_norm(m) for m in raw["manifest"]["members"]}
    groups: dict[str, list[DepEntry]] = lock["mcprl-workspace"][0].get("dev-dependencies", {})  # type: ignore[assignment]
    roots: list[DepEntry] = [
        *(DepEntry(name=m) for m in sorted(members - {"mcprl-workspace"})),
        *groups.get(TEST_GROUP, []),
    ]
    present = frozenset(_norm(h) for h in have)
    files: dict[tuple[str, str], dict[str, int]] = {}
    packages: dict[tuple[str, str], dict[str, object]] = {}
    for python in pythons:
        for name, package in _closure(lock, roots, EXTRAS, python, present).items():
            if name in members:
                continue
            key = (name, str(package["version"]))
            packages[key] = package
            wheels: list[dict[str, object]] = package.get("wheels", [])  # type: ignore[assignment]
            fitting = {
                str(w["url"]).rsplit("/", 1)[1]: int(w.get("size", 0))  # type: ignore[arg-type]
                for w in wheels
                if _wheel_fits(str(w["url"]).rsplit("/", 1)[1], python)
            }
            if wheels and not fitting:
                raise SystemExit(
                    f"fetch-gpu-wheels: uv.lock has no linux x86_64 wheel of {key} for Python {python}"
                )
            if fitting:
                largest = max(fitting, key=lambda f: fitting[f])
                files.setdefault(key, {})[largest] = fitting[largest]
            else:
                sdist: dict[str, object] = package.get("sdist", {})  # type: ignore[assignment]
                files.setdefault(key, {})["sdist"] = int(sdist.get("size", 0))  # type: ignore[arg-type]
    return [
        Dist(name, version, "sdist" not in files[(name, version)], sum(files[(name, version)].values()))
        for name, version in sorted(packages, key=lambda k: (k[0] in OPTIONAL, k))
    ]


def read_have(path: Path) -> tuple[str, ...]:
    """Distribution names from ``pip list``, ``pip freeze`` or one-name-a-line output (``#`` comments allowed)."""
    names: list[str] = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith(("Package", "---")):
            continue
        names.append(re.split(r"[\s=<>@]", line, maxsplit=1)[0])
    return tuple(names)


def checkout_bytes() -> int:
    """What the checkout itself weighs when it travels (git's tracked and untracked-not-ignored files)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    return sum((ROOT / n).stat().st_size for n in listed.decode().split("\0") if n and (ROOT / n).is_file())


def _pip_download(args: list[str], into: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(into),
        *args,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"fetch-gpu-wheels: `{' '.join(cmd)}` failed:\n{done.stderr.strip()[-2000:]}")


def _binary_args(python: str) -> list[str]:
    args = ["--only-binary=:all:", "--implementation", "cp", "--python-version", python]
    for platform in MANYLINUX:
        args += ["--platform", platform]
    return args


def choose(dists: list[Dist], budget: int) -> tuple[list[Dist], list[str]]:
    """The dists that fit ``budget`` bytes (optional backends dropped first) and a line for each left out.

    Raises:
        SystemExit: the required distributions alone exceed the budget.
    """
    required = [d for d in dists if d.name not in OPTIONAL]
    used = sum(d.wheel_bytes for d in required)
    if used > budget:
        raise SystemExit(
            f"fetch-gpu-wheels: the required wheels need {used / 2**20:.1f} MiB but only {budget / 2**20:.1f} MiB "
            "is left of the 64 MiB that travels: fetch for one --python, or pass --have-file with the machine's "
            "`pip list` so that what it has is not fetched"
        )
    chosen, left_out = list(required), []
    for dist in dists[len(required) :]:
        if used + dist.wheel_bytes > budget:
            left_out.append(
                f"left out {dist.name}=={dist.version}: {dist.wheel_bytes / 2**20:.1f} MiB does not fit "
                f"(budget {budget / 2**20:.1f} MiB, {used / 2**20:.1f} MiB used)"
            )
            continue
        used += dist.wheel_bytes
        chosen.append(dist)
    return chosen, left_out


def fetch(into: Path, dists: list[Dist], pythons: tuple[str, ...]) -> None:
    """Download ``dists`` at their locked versions (and the build backend) into ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    for dist in dists:
        spec = f"{dist.name}=={dist.version}"
        if not dist.has_wheels:
            _pip_download(["--no-deps", "--no-binary", ":all:", spec], into)
            continue
        for python in pythons:
            _pip_download(["--no-deps", *_binary_args(python), spec], into)
    for python in pythons:
        _pip_download([*_binary_args(python), *BUILD], into)


def _standin_file(name: str) -> bool:
    """The vocabulary and the Qwen templates (the stand-in model's); the other vendors' templates stay behind."""
    return name == "ggml-vocab-qwen2.gguf" or (name.startswith("Qwen") and name.endswith(".jinja"))


def copy_templates(into: Path) -> Path:
    """The Qwen chat templates and vocabulary (fetched first if needed) as ``into/chat-templates``, a complete
    cache for ``MCPRL_CHAT_TEMPLATES_DIR``."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "fetch-chat-templates.py")],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"fetch-gpu-wheels: the chat templates could not be fetched: {done.stderr.strip()}")
    source = Path(done.stdout.strip())
    target = into / "chat-templates"
    target.mkdir(parents=True)
    names = sorted(f.name for f in source.iterdir() if _standin_file(f.name))
    for name in names:
        shutil.copy2(source / name, target / name)
    (target / ".complete").write_text("\n".join(names) + "\n")
    return target


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


TRAVEL_LIMIT = 64 * 2**20
"""The device tool's limit on the travelling tree (checkout, shared/, carried folders)."""

MARGIN = 2**20
"""Head room left for files others add to the checkout before the next GPU run."""


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="target folder (default .gpu-wheels)")
    parser.add_argument(
        "--python", action="append", help="the machine's Python version (repeatable; default 3.11)"
    )
    parser.add_argument(
        "--have-file",
        type=Path,
        help="`pip list` / `pip freeze` of the machine (default: PLATFORM.md's list, MACHINE_HAS)",
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="print name==version of what the machine lacks, one a line, and stop",
    )
    args = parser.parse_args()
    pythons = tuple(args.python or PYTHONS)
    dists = plan(pythons, read_have(args.have_file) if args.have_file else MACHINE_HAS)
    if args.plan:
        for dist in dists:
            print(f"{dist.name}=={dist.version}")
        return 0
    staging = Path(tempfile.mkdtemp(prefix="mcprl-gpu-templates-"))
    templates = copy_templates(staging)
    budget = TRAVEL_LIMIT - MARGIN - checkout_bytes() - _size(templates)
    chosen, left_out = choose(dists, budget)
    shutil.rmtree(args.dir, ignore_errors=True)
    fetch(args.dir, chosen, pythons)
    shutil.move(templates, args.dir / "chat-templates")
    staging.rmdir()
    (args.dir / "MANIFEST").write_text("".join(f"{d.name}=={d.version}\n" for d in chosen))
    for line in left_out:
        print(line)
    total = _size(args.dir)
    print(
        f"{args.dir}: {total / 2**20:.1f} MiB for Python {', '.join(pythons)} ({len(chosen)} distributions)"
    )
    print(f"travelling tree: {(total + checkout_bytes()) / 2**20:.1f} MiB of 64 MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
