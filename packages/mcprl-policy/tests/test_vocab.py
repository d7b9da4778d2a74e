"""Vocabulary bounds: a model whose embedding has more rows than its tokenizer has ids (Qwen3: 151,936 vs
151,669) samples only decodable ids, and the learner recomputes exactly the sampler's logprobs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from mcprl_policy import HFSampler, ModelLoadError, Policy, ReferencePolicy, SamplingParams, policy_forward
from mcprl_policy.packed import token_logprobs_and_entropy

PADDED_ROWS = 64


def _padded_policy(tiny_dir: Path, *, pad_bias: float) -> Policy:
    """The tiny model with ``PADDED_ROWS`` extra embedding rows (as Qwen pads to a multiple of 128).

    The head gets a bias of ``pad_bias`` on the extra rows, so an unbounded sampler would pick them.
    """
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    model.resize_token_embeddings(len(tokenizer) + PADDED_ROWS, mean_resizing=False)
    rows = model.get_input_embeddings().num_embeddings
    head = nn.Linear(model.config.hidden_size, rows, bias=True)
    head.weight = model.get_input_embeddings().weight  # tied, as the tiny model is
    with torch.no_grad():
        head.bias.zero_()
        head.bias[len(tokenizer) :] = pad_bias
    model.set_output_embeddings(head)
    return Policy(model=model, tokenizer=tokenizer, value_head=None, base_model=str(tiny_dir))


def _prompts(policy: Policy, n: int) -> list[list[int]]:
    return [
        policy.tokenizer.apply_chat_template(
            [{"role": "user", "content": f"What is {i} times ACME?"}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(n)
    ]


def _sample(sampler: HFSampler, prompts: Sequence[list[int]], max_new: int) -> list[list[int]]:
    async def main() -> list[list[int]]:
        with anyio.fail_after(120):
            return [(await sampler.sample(p, max_new_tokens=max_new)).token_ids for p in prompts]

    return anyio.run(main)


def test_vocab_limit_is_the_tokenizers_ids_not_the_embeddings_rows(tiny_dir: Path) -> None:
    policy = _padded_policy(tiny_dir, pad_bias=0.0)
    assert policy.vocab_limit == len(policy.tokenizer)
    assert policy.model.get_input_embeddings().num_embeddings == len(policy.tokenizer) + PADDED_ROWS


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=0)])
def test_ids_the_tokenizer_cannot_decode_are_never_sampled(tiny_dir: Path, params: SamplingParams) -> None:
    policy = _padded_policy(tiny_dir, pad_bias=30.0)  # the padded rows would win every draw
    completions = _sample(HFSampler(policy, params), _prompts(policy, 3), 8)
    assert all(0 <= t < policy.vocab_limit for ids in completions for t in ids), completions


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_logprobs_equal_the_learners_recompute_with_a_padded_vocabulary(
    tiny_dir: Path, temperature: float
) -> None:
    policy = _padded_policy(tiny_dir, pad_bias=5.0)  # the padded rows hold much of the full softmax's mass
    prompts = _prompts(policy, 4)
    sampler = HFSampler(policy, SamplingParams(temperature=temperature, seed=1))

    async def main() -> list[list[float]]:
        out = [await sampler.sample(p, max_new_tokens=10) for p in prompts]
        completions.extend(c.token_ids for c in out)
        return [c.logprobs for c in out]

    completions: list[list[int]] = []
    sampled = anyio.run(main)
    sequences = [p + c for p, c in zip(prompts, completions, strict=True)]
    reference = ReferencePolicy.for_policy(policy)
    with torch.no_grad():
        recomputed = {
            layout: policy_forward(policy, sequences, temperature=temperature, values=False, layout=layout)
            for layout in ("packed", "padded")
        }
        ref = reference.logprobs(sequences, temperature=temperature)
    for i, (prompt, logprobs) in enumerate(zip(prompts, sampled, strict=True)):
        expected = torch.tensor(logprobs)
        for out in (*recomputed.values(), ref):
            torch.testing.assert_close(out.split("logprobs")[i][len(prompt) :], expected, atol=1e-4, rtol=0.0)


def test_logprobs_and_entropy_are_those_of_the_softmax_over_the_limit() -> None:
    generator = torch.Generator().manual_seed(0)
    head = nn.Linear(8, 20, bias=False, dtype=torch.float64)
    hidden = torch.randn(5, 8, generator=generator, dtype=torch.float64)
    targets = torch.tensor([0, 3, 11, 14, 2])
    lp, ent = token_logprobs_and_entropy(hidden, head, targets, temperature=0.5, vocab_limit=15)
    logp = torch.log_softmax(head(hidden)[:, :15].float() / 0.5, dim=-1)
    torch.testing.assert_close(lp, logp.gather(-1, targets[:, None]).squeeze(-1))
    torch.testing.assert_close(ent, -(logp.exp() * logp).sum(-1))
    assert torch.all(lp <= 0)


def test_prompts_may_hold_any_id_the_embedding_has(tiny_dir: Path) -> None:
    policy = _padded_policy(tiny_dir, pad_bias=0.0)
    prompt = [*_prompts(policy, 1)[0][:-2], policy.vocab_limit + 3, *_prompts(policy, 1)[0][-2:]]
    (completion,) = _sample(HFSampler(policy, SamplingParams(temperature=0.0)), [prompt], 3)
    assert len(completion) == 3


def test_a_tokenizer_with_more_ids_than_the_embedding_is_refused(tiny_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    model.resize_token_embeddings(len(tokenizer) - 1)
    with pytest.raises(ModelLoadError, match="different checkpoints"):
        Policy(model=model, tokenizer=tokenizer, value_head=None, base_model=str(tiny_dir))
