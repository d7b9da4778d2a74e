"""The decode engine's choice of each row's next token: sampling, its generators, and the recorded logprobs.

`TokenChooser.choose` turns a batch's last-position logits into one id per row (greedy, or sampled after
temperature, repetition penalty, top-k and top-p) and appends the id and its logprob (tempered by
``logprob_temperature``, untruncated, unpenalised: the distribution training recomputes) to each request.
A request with a ``seed`` draws from its own generator, so its tokens do not depend on its batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from mcprl_policy.config import SamplingParams

if TYPE_CHECKING:
    from mcprl_policy.decode import DecodeRequest

__all__ = ["TokenChooser", "truncated_probs"]


class TokenChooser:
    """Picks one token per row with ``params``; ids ``>= vocab_limit`` never compete (``None``: every id)."""

    def __init__(self, params: SamplingParams, vocab_limit: int | None) -> None:
        self.params = params
        self.vocab_limit = vocab_limit
        # One generator per device sampled on: torch.multinomial needs its generator on the probabilities'
        # device, and the model may move after the engine is built.
        self._generators: dict[torch.device, torch.Generator] = {}

    def generator(self, device: torch.device) -> torch.Generator:
        """The engine's random generator on ``device``, made (and seeded with ``params.seed``) on first use."""
        generator = self._generators.get(device)
        if generator is None:
            generator = torch.Generator(device=device)
            if self.params.seed is not None:
                generator.manual_seed(self.params.seed)
            else:
                generator.seed()
            self._generators[device] = generator
        return generator

    def choose(
        self, logits: torch.Tensor, rows: list[DecodeRequest], seen: torch.Tensor | None
    ) -> torch.Tensor:
        """Pick one token per row; record it and its logprob (tempered, untruncated, unpenalised).

        Only ids below ``vocab_limit`` compete: the distribution sampled and reported is the softmax over
        them, as `token_logprobs_and_entropy` recomputes it for training.
        """
        p = self.params
        logits = logits[:, : self.vocab_limit].float()
        logp = F.log_softmax(logits / p.logprob_temperature, dim=-1)
        scores = logits
        if seen is not None:
            penalised = torch.where(scores > 0, scores / p.repetition_penalty, scores * p.repetition_penalty)
            scores = torch.where(seen[:, : scores.shape[-1]], penalised, scores)
        if p.greedy:
            tokens = scores.argmax(-1)
        else:
            probs = truncated_probs(scores / p.temperature, top_k=p.top_k, top_p=p.top_p)
            tokens = self.draw(probs, rows)
        chosen = logp.gather(-1, tokens[:, None]).squeeze(-1)
        # One device-to-host copy for both: float64 holds every id and every float32 logprob exactly.
        ids, logprobs = torch.stack([tokens.double(), chosen.double()]).tolist()
        for request, token, lp in zip(rows, ids, logprobs, strict=True):
            request.token_ids.append(int(token))
            request.logprobs.append(lp)
        if seen is not None:
            seen.scatter_(1, tokens[:, None], True)
        return tokens

    def draw(self, probs: torch.Tensor, rows: list[DecodeRequest]) -> torch.Tensor:
        """One id per row of ``probs`` ``(B, V)``: seeded rows from their own generators, others the engine's.

        A seeded request's generator (on the probabilities' device, seeded with ``request.seed``) advances only
        with that request's draws, so its tokens do not depend on which rows share its batch or in what order
        they were admitted. ``torch.multinomial`` draws one sample as ``argmax(p / q)`` with ``q ~ Exp(1)``
        drawn from its generator (the exponential race, ATen's ``multinomial`` for ``num_samples=1``); here each
        row's ``q`` comes from its own generator and the division and argmax run once for the batch: the same
        draws as one ``multinomial`` call per row, without its per-call checks.
        """
        device = probs.device
        if all(r.seed is None for r in rows):
            return torch.multinomial(probs, 1, generator=self.generator(device)).squeeze(-1)
        if not bool(torch.isfinite(probs).all()) or bool((probs < 0).any()):
            raise ValueError(
                "probability tensor contains either `inf`, `nan` or element < 0 (the logits are not finite)"
            )
        q = torch.empty_like(probs)
        for i, r in enumerate(rows):
            q[i].exponential_(1.0, generator=self._request_generator(r, device))
        return (probs / q).argmax(-1)

    def _request_generator(self, request: DecodeRequest, device: torch.device) -> torch.Generator:
        if request.seed is None:
            return self.generator(device)
        if request.rng is None:
            request.rng = torch.Generator(device=device)
            request.rng.manual_seed(request.seed)
        return request.rng


def truncated_probs(scores: torch.Tensor, *, top_k: int, top_p: float) -> torch.Tensor:
    """``softmax(scores)`` ``(B, V)`` after top-k and top-p (Holtzman et al. 2020) truncation, row by row."""
    if top_k > 0 and top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = scores.sort(dim=-1, descending=True)
        cumulative = sorted_scores.softmax(-1).cumsum(-1)
        # Drop a token when the mass before it already reaches top_p (the most likely token always stays).
        drop_sorted = (cumulative - sorted_scores.softmax(-1)) >= top_p
        drop = drop_sorted.scatter(1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.softmax(-1)
