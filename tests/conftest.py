"""Fixtures of the end-to-end tests: random-weight stand-ins for real models (`chat_templates_dir` is in the root conftest)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def standin_model(
    chat_templates_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str, str], Path]:
    """Builds (once per session and argument pair) a tiny random-weight Qwen3 with a real Qwen vocabulary.

    The directory holds what a hub checkpoint holds: config.json with the 151,936-row vocabulary, weights,
    the release's tokenizer (`mcprl_policy.standin.qwen_tokenizer`) and the vendor's template as published.
    """
    pytest.importorskip("gguf", reason="the Qwen vocabulary is read from a .gguf file: pip install gguf")
    from mcprl_policy.standin import QwenRelease, qwen_tokenizer, save_standin_model

    built: dict[tuple[str, str], Path] = {}
    releases: dict[str, QwenRelease] = {"qwen2.5": "qwen2.5", "qwen3": "qwen3"}

    def build(release: str, template: str) -> Path:
        key = (release, template)
        if key not in built:
            tokenizer = qwen_tokenizer(
                chat_templates_dir / "ggml-vocab-qwen2.gguf",
                release=releases[release],
                chat_template=(chat_templates_dir / template).read_text(),
            )
            directory = tmp_path_factory.mktemp(f"standin-{release}")
            built[key] = save_standin_model(directory, tokenizer)
        return built[key]

    return build


@pytest.fixture(scope="session")
def llama_standin_model(
    chat_templates_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str, str], Path]:
    """Builds (once per session and argument pair) a tiny random-weight Llama with the real Llama 3 vocabulary.

    ``(release, template file) -> model directory``; release is ``"llama3.1"`` or ``"hermes3"``
    (`mcprl_policy.standin.LlamaRelease`): 128,256 embedding rows, the release's special-token names and
    end-of-turn ids, and the vendor's template as published.
    """
    pytest.importorskip("gguf", reason="the Llama 3 vocabulary is read from a .gguf file: pip install gguf")
    from mcprl_policy.standin import LlamaRelease, llama_tokenizer, save_llama_standin_model

    built: dict[tuple[str, str], Path] = {}
    releases: dict[str, LlamaRelease] = {"llama3.1": "llama3.1", "hermes3": "hermes3"}

    def build(release: str, template: str) -> Path:
        key = (release, template)
        if key not in built:
            tokenizer = llama_tokenizer(
                chat_templates_dir / "ggml-vocab-llama-bpe.gguf",
                release=releases[release],
                chat_template=(chat_templates_dir / template).read_text(),
            )
            directory = tmp_path_factory.mktemp(f"standin-{release}")
            built[key] = save_llama_standin_model(directory, tokenizer, release=releases[release])
        return built[key]

    return build
