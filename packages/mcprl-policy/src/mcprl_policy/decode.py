"""A continuous-batching KV-cache decode loop with exact per-token sampling logprobs.

`DecodeEngine` owns the rows being generated: left-padded token rows sharing one running cache
(`mcprl_policy.batch_cache`: the preallocated `mcprl_policy.kv_pool.KVPool` when every layer is full
attention, a concatenated ``DynamicCache`` otherwise). Each call
of `DecodeEngine.run_until_finished` (run in a worker thread) advances every row one token per step, admits
waiting requests between steps (their prompts are prefilled as one batch and their cache rows written into
the running cache, aligned on their last token), drops finished or cancelled rows, and returns as soon as at least one request has
finished, so the async side can hand results out while generation of the others continues. With a prefix
cache (`mcprl_policy.prefix_cache`), a prompt that extends an earlier request's prompt and completion (the
next turn of an episode) prefills only its new tokens; when every layer is full attention, so does a prompt that
shares only a prefix with an earlier one (the system prompt and tool schemas of another task on the same
servers). Requests admitted together with identical prompts (the G
episodes of a group) are prefilled once and each gets its own copy of the result (`mcprl_policy.shared_prefill`);
with full attention, a long prefix that distinct prompts admitted together share is prefilled once
(`mcprl_policy.shared_prefix`).
Full-attention and linear-attention (Qwen3.5) layers are batched row by row (`mcprl_policy.cache_rows`); other
cache layers are refused when the engine is built.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, assert_never

import attrs
import structlog
import torch
from torch import nn
from transformers import DynamicCache

from mcprl_policy.batch_cache import (
    ConcatCache,
    Forward,
    KVLayout,
    ResolvedLayout,
    RunningCache,
    resolve_layout,
)
from mcprl_policy.cache_rows import cache_from_rows, check_supported, has_recurrent_layers
from mcprl_policy.config import DecodeForward, SamplingParams
from mcprl_policy.fingerprint import weights_fingerprint
from mcprl_policy.kv_pool import KVPool
from mcprl_policy.lean_decode import LeanDecoder, resolve_decode_forward
from mcprl_policy.prefill_batch import after_prefixes, prompt_token_mask, whole_prompts
from mcprl_policy.prefix_cache import CachedPrefix, PrefixCache
from mcprl_policy.shared_prefill import Prefilled, SharedPrompts, fan_out
from mcprl_policy.shared_prefix import group_by_shared_prefix, prefill_prefixes
from mcprl_policy.token_choice import TokenChooser

__all__ = ["DecodeEngine", "DecodeRequest", "DecodeStats"]

from mcprl_policy.completion import FinishReason

_log = structlog.get_logger()


@attrs.define(eq=False, kw_only=True)
class DecodeRequest:
    """One generation request and, once finished, its result.

    ``queued_at`` (`time.monotonic` when it was made) and ``admitted_at`` (when the engine took it from
    ``pending`` into the running batch) time its wait in the queue.
    """

    prompt_ids: list[int]
    max_new_tokens: int
    seed: int | None = None
    queued_at: float = attrs.field(factory=time.monotonic)
    admitted_at: float | None = None
    token_ids: list[int] = attrs.field(factory=list)
    logprobs: list[float] = attrs.field(factory=list)
    finish_reason: FinishReason | None = None
    cancelled: bool = False
    error: BaseException | None = None
    rng: torch.Generator | None = attrs.field(default=None, init=False, repr=False)

    @property
    def finished(self) -> bool:
        """Whether the request has a result (or an error)."""
        return self.finish_reason is not None or self.error is not None

    @property
    def queue_s(self) -> float:
        """Seconds from its making until the engine admitted it (until now while it waits)."""
        end = self.admitted_at if self.admitted_at is not None else time.monotonic()
        return end - self.queued_at


@attrs.define(kw_only=True)
class DecodeStats:
    """Counters of the engine's forward passes, the running rows' cache layout (``pool`` or ``concat``) and the
    decode step's forward (``lean`` or ``model``; not compared: both compute the same bits and counts).

    Every admitted prompt token is counted once: prefilled (``prefill_tokens``), resumed from the prefix cache
    (``prefix_tokens``, whole entries or, with full attention, the part of an entry a prompt shares), or copied
    from an identical prompt admitted with it (``shared_tokens``, over ``shared_rows`` requests that were not
    prefilled themselves) or from the prefix it shares with prompts admitted with it (``shared_tokens``: the
    prefix is prefilled once, counted in ``prefill_tokens``).
    """

    kv_layout: str = ""
    decode_forward: str = attrs.field(default="", eq=False)
    prefill_calls: int = 0
    decode_calls: int = 0
    prefill_rows: int = 0
    decode_rows: int = 0
    prefill_tokens: int = 0
    max_rows: int = 0
    prefix_hits: int = 0
    prefix_tokens: int = 0
    shared_rows: int = 0
    shared_tokens: int = 0


class DecodeEngine:
    """Continuous-batching decode state for one causal LM (not thread-safe: one driver at a time).

    Args:
        model: a causal LM (plain or peft) returning ``logits`` and ``past_key_values``, whose layers are full
            or linear attention (`mcprl_policy.cache_rows.check_supported`).
        params: sampling parameters.
        stop_token_ids: ids that end a row (the end-of-turn id; kept in the row's tokens).
        pad_token_id: id used for left padding (masked out).
        max_batch_size: most rows generated together.
        decode: token ids → text (for stop strings).
        prefix_cache_bytes: Budget of the cross-turn prefix cache (0: every prompt is prefilled whole).
        vocab_limit: ids ``>= vocab_limit`` are never sampled and the reported logprobs are normalised over
            ``[0, vocab_limit)`` (`Policy.vocab_limit`: the ids the tokenizer can decode); ``None``: every
            row of the output embedding.
        kv_layout: the running rows' cache (`mcprl_policy.batch_cache`): ``auto`` takes the preallocated pool
            when every layer is full attention and the concatenated ``DynamicCache`` otherwise.
        decode_forward: the decode step's forward (`mcprl_policy.lean_decode`): ``auto`` is lean where supported.

    Raises:
        SamplerError: the model's cache has layers the engine cannot batch (sliding window, ...), or
            ``kv_layout="pool"`` for a model with linear-attention layers, or ``decode_forward="lean"`` for a
            model the lean forward does not support.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        params: SamplingParams,
        stop_token_ids: frozenset[int],
        pad_token_id: int,
        max_batch_size: int,
        decode: Callable[[list[int]], str],
        prefix_cache_bytes: int = 0,
        vocab_limit: int | None = None,
        kv_layout: KVLayout = "auto",
        decode_forward: DecodeForward = "auto",
    ) -> None:
        if vocab_limit is not None and vocab_limit < 1:
            raise ValueError(f"vocab_limit must be >= 1, got {vocab_limit}")
        check_supported(model)
        self.model = model
        # A recurrent state resumes only right after its last token: cached prefixes are never padded apart
        # from their continuations, so continuations of different lengths prefill separately.
        self._recurrent = has_recurrent_layers(model)
        self.kv_layout: ResolvedLayout = resolve_layout(kv_layout, model)
        self.vocab_limit = vocab_limit
        self.prefix = PrefixCache(prefix_cache_bytes, partial=not self._recurrent)
        self.params = params
        self.stop_token_ids = stop_token_ids
        self.pad_token_id = pad_token_id
        self.max_batch_size = max_batch_size
        self.decode = decode
        self.pending: deque[DecodeRequest] = deque()
        self.decode_forward, lean_refused = resolve_decode_forward(decode_forward, model, self.kv_layout)
        self._step_forward: Forward = LeanDecoder(model) if self.decode_forward == "lean" else self._forward
        self.stats = DecodeStats(kv_layout=self.kv_layout, decode_forward=self.decode_forward)
        self.chooser = TokenChooser(params, vocab_limit)
        self._stop_window = max((len(s) for s in params.stop), default=0) + 8
        _log.info("decode_kv_layout", requested=kv_layout, chosen=self.kv_layout, max_rows=max_batch_size)
        _log.info(
            "decode_forward", requested=decode_forward, chosen=self.decode_forward, lean_refused=lean_refused
        )
        self._reset()

    def _new_cache(self, device: torch.device) -> RunningCache:
        match self.kv_layout:
            case "pool":
                return KVPool(max_rows=self.max_batch_size, device=device)
            case "concat":
                return ConcatCache(device)
            case unreachable:
                assert_never(unreachable)

    def _reset(self) -> None:
        device = self.device
        self._rows: list[DecodeRequest] = []
        self._cache = self._new_cache(device)
        self._positions = torch.zeros(0, dtype=torch.long, device=device)
        self._last = torch.zeros(0, dtype=torch.long, device=device)
        self._seen: torch.Tensor | None = None

    @property
    def device(self) -> torch.device:
        """The model's device (of its first parameter): every tensor and generator of the engine lives there."""
        return next(self.model.parameters()).device

    @property
    def active(self) -> list[DecodeRequest]:
        """Requests currently being generated."""
        return list(self._rows)

    @property
    def idle(self) -> bool:
        """Whether there is neither a running row nor a waiting request."""
        return not self._rows and not self.pending

    def fail_all(self, error: BaseException) -> list[DecodeRequest]:
        """Mark every running and waiting request failed with ``error``, reset the state, return them."""
        failed = [*self._rows, *self.pending]
        for request in failed:
            request.error = error
        self.pending.clear()
        self._reset()
        return failed

    def discard_cancelled(self) -> None:
        """Drop cancelled rows and waiting requests now (only while no worker thread runs the engine)."""
        self._drop(lambda r: r.cancelled)
        for request in [r for r in self.pending if r.cancelled]:
            self.pending.remove(request)

    def run_until_finished(self) -> list[DecodeRequest]:
        """Generate until at least one request finishes (returned) or nothing is left to do (``[]``)."""
        device = self.device
        if self.prefix.max_bytes:
            self.prefix.validate(weights_fingerprint(self.model))
        with torch.inference_mode(), _eval_mode(self.model):
            while True:
                self._drop(lambda r: r.cancelled)
                new = self._take_pending()
                if not self._rows and not new:
                    return []
                finished = self._decode_step(device) if self._rows else []
                if new:
                    finished += self._admit(new, device)
                if finished:
                    return finished

    def _take_pending(self) -> list[DecodeRequest]:
        new: list[DecodeRequest] = []
        while self.pending and len(self._rows) + len(new) < self.max_batch_size:
            request = self.pending.popleft()
            if not request.cancelled:
                request.admitted_at = time.monotonic()
                new.append(request)
        return new

    def _forward(self, **kwargs: Any) -> Any:
        return self.model(use_cache=True, logits_to_keep=1, **kwargs)

    def _admit(self, new: list[DecodeRequest], device: torch.device) -> list[DecodeRequest]:
        """Prefill ``new`` prompts (each distinct prompt once), sample their first token, merge them into the
        running rows."""
        shared = SharedPrompts(new)
        fresh: list[DecodeRequest] = []
        cached: list[tuple[DecodeRequest, CachedPrefix]] = []
        for request in shared.leaders:
            hit = self.prefix.lookup(request.prompt_ids) if self.prefix.max_bytes else None
            if hit is None:
                fresh.append(request)
            else:
                cached.append((request, hit))
        seeded: list[tuple[DecodeRequest, CachedPrefix]] = []
        seeded_tokens = 0
        if not self._recurrent and len(fresh) > 1:
            fresh, seeded, seeded_tokens = self._prefill_shared_prefixes(fresh, device)
        if fresh:
            self._merge(self._prefill(fresh, shared, device))
        if seeded:
            self._merge(self._prefill_cached(seeded, shared, device, seeded_tokens=seeded_tokens))
        for group in self._cached_groups(cached):
            self._merge(self._prefill_cached(group, shared, device))
        return self._finish_rows()

    def _prefill_shared_prefixes(
        self, fresh: list[DecodeRequest], device: torch.device
    ) -> tuple[list[DecodeRequest], list[tuple[DecodeRequest, CachedPrefix]], int]:
        """Prefill once each prefix that prompts of ``fresh`` share (`mcprl_policy.shared_prefix`) and keep it in
        the prefix cache; the prompts still to prefill whole, those resuming a shared prefix, its tokens."""
        groups = group_by_shared_prefix(fresh, block=self.prefix.block_tokens)
        if not groups:
            return fresh, [], 0
        states = prefill_prefixes(
            self._forward, self.model, list(groups), pad_token_id=self.pad_token_id, device=device
        )
        seeded: list[tuple[DecodeRequest, CachedPrefix]] = []
        for (ids, members), state in zip(groups.items(), states, strict=True):
            self.prefix.put(ids, state)
            seeded += [(request, state) for request in members]
        tokens = sum(len(ids) for ids in groups)
        self.stats.prefill_calls += 1
        self.stats.prefill_rows += len(groups)
        self.stats.prefill_tokens += tokens
        taken = {id(r) for r, _ in seeded}
        return [r for r in fresh if id(r) not in taken], seeded, tokens

    def _cached_groups(
        self, hits: list[tuple[DecodeRequest, CachedPrefix]]
    ) -> list[list[tuple[DecodeRequest, CachedPrefix]]]:
        """Prefix hits batched into one prefill each: all together, or by new-token count for recurrent models."""
        if not self._recurrent or len(hits) < 2:
            return [hits] if hits else []
        groups: dict[int, list[tuple[DecodeRequest, CachedPrefix]]] = {}
        for request, prefix in hits:
            groups.setdefault(len(request.prompt_ids) - prefix.length, []).append((request, prefix))
        return list(groups.values())

    def _prefill(self, new: list[DecodeRequest], shared: SharedPrompts, device: torch.device) -> _State:
        """Prefill whole prompts (left-padded) and sample the first token of each request sharing them."""
        prompts = [r.prompt_ids for r in new]
        batch = whole_prompts(prompts, pad_token_id=self.pad_token_id, device=device)
        out = self._forward(
            input_ids=batch.ids,
            attention_mask=batch.mask,
            position_ids=batch.positions,
            past_key_values=DynamicCache(config=getattr(self.model, "config", None)),
        )
        return self._started(
            new, [len(p) for p in prompts], shared, self._prefilled(prompts, out, batch.mask)
        )

    def _prefill_cached(
        self,
        hits: list[tuple[DecodeRequest, CachedPrefix]],
        shared: SharedPrompts,
        device: torch.device,
        *,
        seeded_tokens: int | None = None,
    ) -> _State:
        """Prefill only what follows each row's cached prefix (`mcprl_policy.prefill_batch.after_prefixes`).

        The prefixes are prefix-cache hits, or (``seeded_tokens``: how many tokens their prefill took) prefixes
        shared by prompts of this admission.
        """
        rows = [r for r, _ in hits]
        prompts = [r.prompt_ids for r in rows]
        prefixes = [p.length for _, p in hits]
        batch = after_prefixes(prompts, prefixes, pad_token_id=self.pad_token_id, device=device)
        cache = cache_from_rows(self.model, [p.layers for _, p in hits], width=max(prefixes), device=device)
        out = self._forward(
            input_ids=batch.ids,
            attention_mask=batch.mask,
            position_ids=batch.positions,
            past_key_values=cache,
        )
        tails = [len(p) - n for p, n in zip(prompts, prefixes, strict=True)]
        state = self._started(rows, tails, shared, self._prefilled(prompts, out, batch.mask))
        resumed = sum(prefixes[i] for i in state.leaders)
        if seeded_tokens is None:
            self.stats.prefix_hits += len(state.leaders)
            self.stats.prefix_tokens += resumed
        else:
            self.stats.shared_tokens += resumed - seeded_tokens
        return state

    def _prefilled(self, prompts: list[list[int]], out: Any, mask: torch.Tensor) -> Prefilled:
        logits = out.logits[:, -1]
        seen = None
        if self.params.repetition_penalty != 1.0:
            seen = prompt_token_mask(prompts, vocab=int(logits.shape[-1]), device=logits.device)
        return Prefilled(cache=out.past_key_values, mask=mask, logits=logits, seen=seen)

    def _started(
        self, leaders: list[DecodeRequest], tokens: list[int], shared: SharedPrompts, prefilled: Prefilled
    ) -> _State:
        """Give every request sharing a prompt with ``leaders`` (``tokens`` prefilled each) its copy of its
        leader's prefilled state and sample its first token; the rows' state, ready to merge into the batch."""
        rows, index = shared.rows(leaders)
        self.stats.prefill_calls += 1
        self.stats.prefill_rows += len(leaders)
        self.stats.prefill_tokens += sum(tokens)
        self.stats.shared_rows += len(rows) - len(leaders)
        self.stats.shared_tokens += sum(tokens[i] for i in index) - sum(tokens)
        state = fan_out(prefilled, index)
        first = self.chooser.choose(state.logits, rows, state.seen)
        return _State(
            rows=rows,
            leaders=index,
            cache=state.cache,
            mask=state.mask,
            positions=state.mask.sum(-1),
            last=first,
            seen=state.seen,
        )

    def _decode_step(self, device: torch.device) -> list[DecodeRequest]:
        del device
        logits = self._cache.step(self._step_forward, self._last, self._positions)
        self.stats.decode_calls += 1
        self.stats.decode_rows += len(self._rows)
        self._positions = self._positions + 1
        self._last = self.chooser.choose(logits, self._rows, self._seen)
        return self._finish_rows()

    def _finish_rows(self) -> list[DecodeRequest]:
        for request in self._rows:
            last = request.token_ids[-1]
            if last in self.stop_token_ids or self._hit_stop_string(request):
                request.finish_reason = "stop"
            elif len(request.token_ids) >= request.max_new_tokens:
                request.finish_reason = "length"
        finished = [r for r in self._rows if r.finish_reason is not None]
        if finished:
            if self.prefix.max_bytes:
                self._store_prefixes()
            self._drop(lambda r: r.finish_reason is not None)
        return finished

    def _store_prefixes(self) -> None:
        """Keep each finished row's state (prompt + all generated tokens but the last, which was never fed)."""
        for i, request in enumerate(self._rows):
            if request.finish_reason is None:
                continue
            consumed = [*request.prompt_ids, *request.token_ids[:-1]]
            self.prefix.put(consumed, CachedPrefix(layers=self._cache.row_state(i), length=len(consumed)))

    def _hit_stop_string(self, request: DecodeRequest) -> bool:
        if not self.params.stop:
            return False
        tail = self.decode(request.token_ids[-self._stop_window :])
        return any(s in tail for s in self.params.stop)

    def _drop(self, predicate: Callable[[DecodeRequest], bool]) -> None:
        keep = [i for i, r in enumerate(self._rows) if not predicate(r)]
        if len(keep) == len(self._rows):
            return
        if not keep:
            self._reset()
            return
        index = torch.tensor(keep, dtype=torch.long, device=self._positions.device)
        self._rows = [self._rows[i] for i in keep]
        self._positions = self._positions[index]
        self._last = self._last[index]
        if self._seen is not None:
            self._seen = self._seen[index]
        self._cache.drop(keep)

    def _merge(self, other: _State) -> None:
        self._cache.merge(other.cache, other.mask)
        if not self._rows:
            self._rows = other.rows
            self._positions, self._last, self._seen = other.positions, other.last, other.seen
        else:
            self._rows = [*self._rows, *other.rows]
            self._positions = torch.cat([self._positions, other.positions])
            self._last = torch.cat([self._last, other.last])
            if self._seen is not None and other.seen is not None:
                self._seen = torch.cat([self._seen, other.seen])
        self.stats.max_rows = max(self.stats.max_rows, len(self._rows))


@attrs.define(kw_only=True)
class _State:
    rows: list[DecodeRequest]
    leaders: list[int]  # per row: the index of the prefilled row it was copied from
    cache: DynamicCache
    mask: torch.Tensor
    positions: torch.Tensor
    last: torch.Tensor
    seen: torch.Tensor | None


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
