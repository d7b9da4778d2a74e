"""The decode engine takes every device from the model.

On CUDA or MPS, ``torch.multinomial`` raises when its generator lives on another device than the
probabilities, and a forward raises on inputs left on the CPU. On a CPU-only machine both sides are CPU, so
these tests record what the engine *asks for*: the device each generator is made for and the ``device=`` of
each tensor the engine builds, which must be the model's. `test_hf_sampler.py` runs the sampler on CUDA
(``gpu`` marker).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from decode_testkit import build_engine
from torch.overrides import TorchFunctionMode
from transformers import AutoModelForCausalLM, AutoTokenizer

import mcprl_policy.batch_cache
import mcprl_policy.decode
import mcprl_policy.kv_pool
import mcprl_policy.token_choice
from mcprl_policy import SamplingParams
from mcprl_policy.batch_cache import KVLayout
from mcprl_policy.decode import DecodeEngine, DecodeRequest

_FACTORIES = {torch.tensor, torch.zeros, torch.ones, torch.full, torch.arange, torch.empty}
_ENGINE_FILES = {
    m.__file__
    for m in (mcprl_policy.decode, mcprl_policy.kv_pool, mcprl_policy.batch_cache, mcprl_policy.token_choice)
}


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_dir: Path) -> tuple[Any, Any]:
    return AutoModelForCausalLM.from_pretrained(tiny_dir), AutoTokenizer.from_pretrained(tiny_dir)


def _run_two_turns(engine: DecodeEngine, tokenizer: Any, *, seeded: bool = False) -> None:
    """Prefill, decode, drop finished rows, then next turns that reuse the cached prefixes.

    ``seeded``: the first turns carry per-request seeds (their own generators), the second turns do not.
    """
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"price of ACME {i}" + " now" * i}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(3)
    ]
    turns = [
        DecodeRequest(prompt_ids=p, max_new_tokens=3 + i, seed=100 + i if seeded else None)
        for i, p in enumerate(prompts)
    ]
    engine.pending.extend(turns)
    while not engine.idle:
        engine.run_until_finished()
    engine.pending.extend(
        DecodeRequest(prompt_ids=[*t.prompt_ids, *t.token_ids, *prompts[0][-4:]], max_new_tokens=4)
        for t in turns
    )
    while not engine.idle:
        engine.run_until_finished()
    assert engine.stats.prefix_hits == 3


class _RecordingGenerator(torch.Generator):
    """A CPU generator that remembers which device it was asked for (``None``: no device given)."""

    requested: ClassVar[dict[int, torch.device | None]] = {}

    def __init__(self, device: torch.device | str | None = None) -> None:
        super().__init__()
        _RecordingGenerator.requested[id(self)] = None if device is None else torch.device(device)


@pytest.fixture
def recorded_generators(monkeypatch: pytest.MonkeyPatch) -> list[tuple[torch.device, Any]]:
    """Generators made through ``torch.Generator``; each ``multinomial`` call's (probs device, generator)."""
    _RecordingGenerator.requested = {}
    draws: list[tuple[torch.device, Any]] = []
    multinomial: Callable[..., torch.Tensor] = torch.multinomial

    def spy(probs: torch.Tensor, *args: Any, generator: Any = None, **kwargs: Any) -> torch.Tensor:
        draws.append((probs.device, generator))
        return multinomial(probs, *args, generator=generator, **kwargs)

    monkeypatch.setattr(torch, "Generator", _RecordingGenerator)
    monkeypatch.setattr(torch, "multinomial", spy)
    return draws


@pytest.mark.parametrize("seeded", [False, True])
def test_every_draw_uses_a_generator_made_for_the_probabilities_device(
    model_and_tokenizer: tuple[Any, Any], recorded_generators: list[tuple[torch.device, Any]], seeded: bool
) -> None:
    model, tokenizer = model_and_tokenizer
    engine = build_engine(
        model, tokenizer, params=SamplingParams(temperature=1.0, top_p=0.9, seed=5), max_batch_size=8
    )
    _run_two_turns(engine, tokenizer, seeded=seeded)
    device = next(model.parameters()).device
    assert recorded_generators, "the engine never sampled"
    for probs_device, generator in recorded_generators:
        assert probs_device == device
        assert generator is not None, "multinomial without the engine's generator is not reproducible"
        assert _RecordingGenerator.requested.get(id(generator)) == device, (
            "the sampling generator was not made for the model's device (torch.Generator() is a CPU "
            "generator: multinomial on CUDA/MPS probabilities raises)"
        )


class _FactoryDevices(TorchFunctionMode):
    """Records ``(factory, device=)`` of every tensor factory called from the engine's modules (decode.py and
    the running rows' caches, kv_pool.py and batch_cache.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, Any]] = []

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func in _FACTORIES and sys._getframe(1).f_code.co_filename in _ENGINE_FILES:
            device = kwargs.get("device")
            self.calls.append((func.__name__, None if device is None else torch.device(device)))
        return func(*args, **kwargs)


@pytest.mark.parametrize("kv_layout", ["pool", "concat"])
@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0), SamplingParams(repetition_penalty=1.3)])
def test_every_tensor_the_engine_builds_is_made_on_the_models_device(
    model_and_tokenizer: tuple[Any, Any], params: SamplingParams, kv_layout: KVLayout
) -> None:
    model, tokenizer = model_and_tokenizer
    engine = build_engine(model, tokenizer, params=params, max_batch_size=8, kv_layout=kv_layout)
    assert engine.stats.kv_layout == kv_layout
    device = next(model.parameters()).device
    with _FactoryDevices() as mode:
        _run_two_turns(engine, tokenizer)
    assert mode.calls, "no tensor factory call was recorded"
    elsewhere = [(name, d) for name, d in mode.calls if d != device]
    assert not elsewhere, f"tensors built without device={device}: {elsewhere}"


def test_same_seed_same_tokens_on_the_cpu(model_and_tokenizer: tuple[Any, Any]) -> None:
    model, tokenizer = model_and_tokenizer
    runs = []
    for _ in range(2):
        engine = build_engine(
            model, tokenizer, params=SamplingParams(temperature=1.0, seed=11), max_batch_size=8
        )
        request = DecodeRequest(prompt_ids=tokenizer.encode("price of ACME"), max_new_tokens=12)
        engine.pending.append(request)
        while not engine.idle:
            engine.run_until_finished()
        runs.append(request.token_ids)
    assert runs[0] == runs[1]
