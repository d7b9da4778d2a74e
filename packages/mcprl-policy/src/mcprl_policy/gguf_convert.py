"""A GGUF file as a model name: converted once into a Hugging Face directory in the model cache.

transformers reads a GGUF file (``from_pretrained(dir, gguf_file=...)``; needs ``pip install gguf``) by
dequantising its weights, which takes seconds and cannot be mmapped, and refuses to ``save_pretrained`` the
result while it carries the GGUF ``quantization_config``. `convert_gguf` therefore loads the file once, drops
that config, and saves model and tokenizer (optionally with another chat template) under
``<cache>/models/<name>-<digest>``, the digest covering the file's sha256, the template and the converter's
version: a second call with the same inputs is a directory lookup.

Weights are saved as float32 safetensors: a Q4_1/Q8_0 weight is ``scale * q + min`` with float16 scale and
min, which float32 holds exactly and bfloat16 (8 significant bits) does not, so the directory loads to the very
numbers the GGUF dequantises to, and fp32 master weights (what training keeps) need no up-cast. It costs twice
the disk of bfloat16 (540 MB for a 135 M-parameter model); loading it in bfloat16 is a cast at load time.

A directory is written whole in a temp sibling and renamed into place, with a marker naming every file and its
size written last; a directory without a valid marker, or with a file of another size (an interrupted copy),
is built again.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Final, cast

import structlog
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from mcprl_policy.errors import ModelLoadError
from mcprl_policy.tiny import mcprl_cache_dir

__all__ = ["MARKER", "convert_gguf", "converted_dir", "file_sha256", "is_complete", "is_gguf_file"]

_log = structlog.get_logger()

# Bump when the converter changes in a way that changes the produced files.
_CONVERTER_VERSION: Final = 1

MARKER: Final = ".mcprl-converted.json"
"""Written last into a converted directory: the source's sha256 and the size of every file."""

_REQUIRED: Final = ("config.json", "model.safetensors", "tokenizer.json")


def is_gguf_file(name: str) -> bool:
    """Whether ``name`` is a path to an existing ``.gguf`` file."""
    path = Path(name).expanduser()
    return path.suffix.lower() == ".gguf" and path.is_file()


def file_sha256(path: Path) -> str:
    """The hex sha256 of the file at ``path``, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def converted_dir(
    name: str, sha256: str, *, chat_template: str | None, cache_dir: Path | None = None
) -> Path:
    """Where `convert_gguf` puts the GGUF with ``sha256`` converted as ``name`` (whether or not it is there yet).

    Args:
        name: the directory's readable prefix (a model name or the file's stem).
        sha256: the GGUF file's hex sha256.
        chat_template: the chat template saved instead of the GGUF's own (None keeps the GGUF's).
        cache_dir: root of the model cache (default ``mcprl_cache_dir() / "models"``).
    """
    payload = json.dumps(
        {"converter": _CONVERTER_VERSION, "gguf_sha256": sha256, "chat_template": chat_template},
        sort_keys=True,
    )
    digest = hashlib.sha256(payload.encode()).hexdigest()[:12]
    root = cache_dir if cache_dir is not None else mcprl_cache_dir() / "models"
    return root / f"{name}-{digest}"


def is_complete(directory: Path) -> bool:
    """Whether ``directory`` is a finished conversion: its marker lists every file, each of the listed size."""
    try:
        marker = json.loads((directory / MARKER).read_text())
        files: dict[str, int] = marker["files"]
        return set(_REQUIRED) <= set(files) and all(
            (directory / rel).stat().st_size == size for rel, size in files.items()
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def convert_gguf(
    gguf: Path,
    *,
    name: str | None = None,
    sha256: str | None = None,
    chat_template: str | None = None,
    cache_dir: Path | None = None,
) -> Path:
    """The Hugging Face directory of the GGUF file ``gguf``, converting it on first use.

    Args:
        gguf: a ``.gguf`` file of an architecture transformers reads (Llama, Qwen2, Qwen3, Mistral, ...).
        name: the cache directory's prefix (default: the file's stem).
        sha256: the file's sha256 when the caller has just checked it (default: computed here).
        chat_template: saved as the tokenizer's chat template instead of the GGUF's own (None keeps that).
        cache_dir: root of the model cache (default ``mcprl_cache_dir() / "models"``).

    Returns:
        A directory that ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` load.

    Raises:
        ModelLoadError: the file is missing or transformers cannot read it (the message names the file).
    """
    if not gguf.is_file():
        raise ModelLoadError(f"GGUF file {str(gguf)!r} does not exist")
    digest = sha256 if sha256 is not None else file_sha256(gguf)
    target = converted_dir(name or gguf.stem, digest, chat_template=chat_template, cache_dir=cache_dir)
    if is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    # Build in a sibling temp dir and rename: a concurrent or interrupted build never leaves a half directory.
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        _convert_into(gguf, tmp, chat_template=chat_template)
        _write_marker(tmp, digest)
        tmp.chmod(0o755)  # mkdtemp's 0700 would keep the cache from other users of a shared MCPRL_CACHE
        if target.exists() and not is_complete(target):
            shutil.rmtree(target)  # an earlier build's remains, never a finished one
        try:
            tmp.rename(target)
        except OSError:
            if not is_complete(target):  # else another process finished the same conversion first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _log.info(
        "gguf_converted",
        gguf=str(gguf),
        path=str(target),
        seconds=round(time.perf_counter() - started, 1),
        megabytes=round(sum(p.stat().st_size for p in target.iterdir()) / 2**20, 1),
    )
    return target


def _convert_into(gguf: Path, out: Path, *, chat_template: str | None) -> None:
    """Load ``gguf`` dequantised in float32 and save model and tokenizer into ``out``."""
    where, file = str(gguf.parent), gguf.name
    # transformers leaves from_pretrained's **kwargs (and AutoTokenizer's return type) unannotated.
    try:
        tokenizer = cast(Any, AutoTokenizer.from_pretrained(where, gguf_file=file))  # pyright: ignore[reportUnknownMemberType]
        model: Any = AutoModelForCausalLM.from_pretrained(  # pyright: ignore[reportUnknownMemberType]
            where, gguf_file=file, dtype=torch.float32, **_dequantize_kwargs()
        )
    except ImportError as exc:
        raise ModelLoadError(
            f"converting the GGUF file {str(gguf)!r} needs the gguf package ({exc}): `pip install gguf`"
        ) from exc
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"transformers could not read the GGUF file {str(gguf)!r}: {exc}") from exc
    _drop_quantization(model)
    packed = sorted({str(p.dtype) for p in model.parameters()} - {str(torch.float32)})
    if packed:
        raise ModelLoadError(
            f"GGUF file {str(gguf)!r} loaded with weights still packed ({packed}); converting needs every "
            "weight dequantised to float32"
        )
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.model_max_length = int(model.config.max_position_embeddings)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    missing = [rel for rel in _REQUIRED if not (out / rel).is_file()]
    if missing:
        # transformers writes weights only on rank 0 once torch.distributed is initialised.
        raise ModelLoadError(
            f"converting {str(gguf)!r}: save_pretrained wrote no {missing} in this process (a non-zero "
            "torch.distributed rank, or a model sharded over several files?); convert it on rank 0 first"
        )


def _dequantize_kwargs() -> dict[str, Any]:
    """Ask transformers to dequantise every weight (versions with `GgufConfig` may otherwise keep them packed)."""
    try:
        from transformers import GgufConfig  # pyright: ignore[reportAttributeAccessIssue, reportUnknownVariableType]
    except ImportError:  # older transformers always dequantise a GGUF
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _drop_quantization(model: Any) -> None:
    """Forget the GGUF ``quantization_config``: the weights are plain tensors, and save_pretrained refuses it."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and hasattr(quantizer, "remove_quantization_config"):
        quantizer.remove_quantization_config(model)
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    if getattr(model, "hf_quantizer", None) is not None:
        del model.hf_quantizer
    model.is_quantized = False


def _write_marker(directory: Path, sha256: str) -> None:
    files = {p.name: p.stat().st_size for p in sorted(directory.iterdir()) if p.is_file()}
    (directory / MARKER).write_text(json.dumps({"gguf_sha256": sha256, "files": files}, indent=1) + "\n")
