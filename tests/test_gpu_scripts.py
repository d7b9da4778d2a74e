"""What of `scripts/test-gpu.sh` and `scripts/fetch-gpu-wheels.py` can run without a GPU or the network.

The scripts parse, the GPU script refuses a machine without CUDA at once and says why, and the wheel plan
(computed from uv.lock by the fetch script) covers every third-party import of the workspace's code that the GPU
machine lacks: a dependency added to the code without reaching the plan fails here.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_GPU = ROOT / "scripts" / "test-gpu.sh"
FETCH = ROOT / "scripts" / "fetch-gpu-wheels.py"


def _fetch_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fetch_gpu_wheels", FETCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _run_test_gpu(
    *args: str, env: dict[str, str], cwd: Path
) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    done = subprocess.run(
        ["bash", str(TEST_GPU), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
        check=False,
    )
    return done, time.monotonic() - start


@pytest.mark.parametrize("script", ["test-gpu.sh", "test-vllm-cpu.sh"])
def test_the_shell_scripts_parse(script: str) -> None:
    done = subprocess.run(
        ["bash", "-n", str(ROOT / "scripts" / script)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def test_help_and_an_unknown_argument() -> None:
    env = dict(os.environ)
    shown, _ = _run_test_gpu("--help", env=env, cwd=ROOT)
    assert shown.returncode == 0
    assert "usage: scripts/test-gpu.sh" in shown.stdout
    wrong, _ = _run_test_gpu("--fast", env=env, cwd=ROOT)
    assert wrong.returncode == 2
    assert "unknown argument --fast" in wrong.stderr


def test_without_nvidia_smi_it_exits_at_once_and_writes_nothing(tmp_path: Path) -> None:
    path = ":".join(p for p in os.environ["PATH"].split(":") if not (Path(p) / "nvidia-smi").exists())
    out = tmp_path / "results"
    done, took = _run_test_gpu("--out", str(out), env={**os.environ, "PATH": path}, cwd=tmp_path)
    assert done.returncode == 2
    assert "test-gpu: no CUDA device: nvidia-smi is not on PATH" in done.stderr
    assert not out.exists()
    assert took < 10


def test_a_driver_without_a_cuda_torch_is_refused_before_installing(tmp_path: Path) -> None:
    # A test double for the driver tool (no GPU here): nvidia-smi answers, but this Python's torch sees no CUDA
    # device, which is what the script must catch next.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'Stand-in GPU, 81559 MiB, 580.0'\n")
    fake.chmod(0o755)
    venv = tmp_path / "venv"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHON": sys.executable,
        "CUDA_VISIBLE_DEVICES": "",
    }
    done, _ = _run_test_gpu("--out", str(tmp_path / "results"), "--venv", str(venv), env=env, cwd=tmp_path)
    assert done.returncode == 2
    assert "no CUDA device usable by" in done.stderr
    assert "torch.cuda.is_available() is False" in done.stderr
    assert not venv.exists()
    assert not (tmp_path / "results").exists()


def _third_party_imports() -> dict[str, set[str]]:
    """Top-level modules imported anywhere (lazily too) in the members' sources, with the files importing them.

    A module beside the importing file is first-party too: a script run by path (the sandbox supervisor) imports
    its sibling package by its bare name."""
    first_party = ("mcprl_", "__future__")
    found: dict[str, set[str]] = {}
    for source in [*ROOT.glob("packages/*/src/**/*.py"), *ROOT.glob("apps/*/src/**/*.py")]:
        for node in ast.walk(ast.parse(source.read_text(), str(source))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                beside = (source.parent / top).is_dir() or (source.parent / f"{top}.py").is_file()
                if top not in sys.stdlib_module_names and not top.startswith(first_party) and not beside:
                    found.setdefault(top, set()).add(str(source.relative_to(ROOT)))
    return found


def test_the_wheel_plan_covers_every_import_the_gpu_machine_lacks() -> None:
    fetch = _fetch_module()
    done = subprocess.run(
        [sys.executable, str(FETCH), "--plan"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    planned = {_norm(line.split("==")[0]) for line in done.stdout.split()}
    assert {"mcp", "structlog", "pydantic", "deepspeed", "bitsandbytes", "gguf"} <= planned
    covered = planned | {_norm(n) for n in fetch.MACHINE_HAS} | set(fetch.CANNOT_TRAVEL)
    providers = importlib.metadata.packages_distributions()
    uncovered: list[str] = []
    for module, files in sorted(_third_party_imports().items()):
        dists = {_norm(d) for d in providers.get(module, [])}
        if not dists:
            if module not in fetch.CANNOT_TRAVEL:
                uncovered.append(
                    f"{module} (no installed distribution provides it; imported by {sorted(files)})"
                )
        elif not dists & covered:
            uncovered.append(f"{module} from {sorted(dists)} (imported by {sorted(files)})")
    assert not uncovered, (
        "imported but neither fetched by scripts/fetch-gpu-wheels.py, nor on the GPU machine (MACHINE_HAS), "
        "nor listed in CANNOT_TRAVEL; declare it in the member's pyproject.toml and `uv lock`: "
        + "; ".join(uncovered)
    )


def test_a_have_file_from_the_machine_narrows_the_plan(tmp_path: Path) -> None:
    pip_list = tmp_path / "have.txt"
    pip_list.write_text(
        "Package    Version\n---------- -------\n"
        + "".join(f"{n} 1.0\n" for n in _fetch_module().MACHINE_HAS)
        + "matplotlib==3.10.0\npillow 12.0\n# a comment\n"
    )
    done = subprocess.run(
        [sys.executable, str(FETCH), "--plan", "--have-file", str(pip_list)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    planned = {line.split("==")[0] for line in done.stdout.split()}
    assert "mcp" in planned
    assert not {"matplotlib", "pillow", "torch"} & planned


def test_optional_backends_are_left_out_first_and_required_wheels_never() -> None:
    fetch = _fetch_module()
    mib = 2**20
    dists = [
        fetch.Dist("mcp", "2.3.0", True, 5 * mib),
        fetch.Dist("bitsandbytes", "0.50.2", True, 41 * mib),
        fetch.Dist("deepspeed", "0.19.8", False, 2 * mib),
    ]
    chosen, left_out = fetch.choose(dists, 10 * mib)
    assert [d.name for d in chosen] == ["mcp", "deepspeed"]
    assert len(left_out) == 1
    assert left_out[0].startswith("left out bitsandbytes==0.50.2: 41.0 MiB does not fit")
    with pytest.raises(SystemExit, match=r"required wheels need 5\.0 MiB but only 4\.0 MiB"):
        fetch.choose(dists, 4 * mib)
