"""Fixtures of the end-to-end tests: random-weight stand-ins for real models (`chat_templates_dir` is in the root
conftest); the test kits on sys.path: `e2e_testkit.py` here and mcprl-train's `train_testkit.py`, whose
synthetic episodes the GPU tests (gpu/) feed the learner."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

# --import-mode=importlib adds no test directory
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).parents[1] / "packages" / "mcprl-train" / "tests"))

from e2e_testkit import StandinModel

from mcprl_policy import ModelLoadError, fetch_pinned_model

SaveStandin = Callable[[str, str, Path], Path]
"""``(release, chat template text, empty directory) -> model directory``."""


def _built_once(save: SaveStandin, chat_templates_dir: Path, factory: pytest.TempPathFactory) -> StandinModel:
    """``save`` once per argument pair; thread-safe, since a `RunPool` job may ask first."""
    built: dict[tuple[str, str], Path] = {}
    lock = threading.Lock()

    def model(release: str, template: str) -> Path:
        with lock:
            if (release, template) not in built:
                text = (chat_templates_dir / template).read_text()
                built[release, template] = save(release, text, factory.mktemp(f"standin-{release}"))
            return built[release, template]

    return model


@pytest.fixture(scope="session")
def standin_model(chat_templates_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> StandinModel:
    """Builds (once per session and argument pair) a tiny random-weight Qwen with a real Qwen vocabulary.

    Release ``"qwen3"`` or ``"qwen2.5"``: a two-layer ``Qwen3ForCausalLM`` with the release's tokenizer;
    ``"qwen3.5"``: a four-layer ``Qwen3_5ForCausalLM`` hybrid (gated-delta-net linear attention alternating with
    full attention) with the Qwen3 tokenizer, which holds every token Qwen3.5's template writes;
    ``"qwen3.5-248k"``: the same hybrid with Qwen3.5's own vocabulary (`qwen35_tokenizer`, 248,320 embedding
    rows; skipped with the reason when scripts/fetch-chat-templates.py could not fetch it). The directory holds
    what a hub checkpoint holds: config.json, weights, the tokenizer (`mcprl_policy.standin.qwen_tokenizer` or
    `mcprl_policy.tiktoken_tokenizers.qwen35_tokenizer`) and the vendor's template as published.
    """
    pytest.importorskip("gguf", reason="the Qwen vocabulary is read from a .gguf file: pip install gguf")
    from mcprl_policy.standin import QwenRelease, StandinArchitecture, qwen_tokenizer, save_standin_model

    kinds: dict[str, tuple[QwenRelease, StandinArchitecture]] = {
        "qwen2.5": ("qwen2.5", "qwen3"),
        "qwen3": ("qwen3", "qwen3"),
        "qwen3.5": ("qwen3", "qwen3.5"),
    }

    def save(release: str, template: str, directory: Path) -> Path:
        if release == "qwen3.5-248k":
            from mcprl_policy.tiktoken_tokenizers import qwen35_tokenizer

            ranks = chat_templates_dir / "qwen3_6.tiktoken"
            if not ranks.is_file():
                pytest.skip(f"{ranks} is missing: scripts/fetch-chat-templates.py could not fetch it")
            tokenizer = qwen35_tokenizer(ranks, chat_template=template)
            return save_standin_model(directory, tokenizer, architecture="qwen3.5", vocabulary="qwen3.5")
        vocabulary, architecture = kinds[release]
        gguf = chat_templates_dir / "ggml-vocab-qwen2.gguf"
        tokenizer = qwen_tokenizer(gguf, release=vocabulary, chat_template=template)
        return save_standin_model(directory, tokenizer, architecture=architecture)

    return _built_once(save, chat_templates_dir, tmp_path_factory)


@pytest.fixture(scope="session")
def llama_standin_model(chat_templates_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> StandinModel:
    """Builds (once per session and argument pair) a tiny random-weight Llama with the real Llama 3 vocabulary.

    Release ``"llama3.1"`` or ``"hermes3"`` (`mcprl_policy.standin.LlamaRelease`): 128,256 embedding rows, the
    release's special-token names and end-of-turn ids, and the vendor's template as published.
    """
    pytest.importorskip("gguf", reason="the Llama 3 vocabulary is read from a .gguf file: pip install gguf")
    from mcprl_policy.standin import LlamaRelease, llama_tokenizer, save_llama_standin_model

    releases: dict[str, LlamaRelease] = {"llama3.1": "llama3.1", "hermes3": "hermes3"}

    def save(release: str, template: str, directory: Path) -> Path:
        gguf = chat_templates_dir / "ggml-vocab-llama-bpe.gguf"
        tokenizer = llama_tokenizer(gguf, release=releases[release], chat_template=template)
        return save_llama_standin_model(directory, tokenizer, release=releases[release])

    return _built_once(save, chat_templates_dir, tmp_path_factory)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The converted directory of ``smollm2-135m`` in the machine's model cache (fetched on first use); skips with
    the reason where it cannot be fetched."""
    if os.environ.get("MCPRL_NO_PRETRAINED"):
        pytest.skip("smollm2-135m unavailable: MCPRL_NO_PRETRAINED is set")
    try:
        return fetch_pinned_model("smollm2-135m")
    except ModelLoadError as exc:
        pytest.skip(f"smollm2-135m unavailable: {exc}")
