"""An LLM judge as a ``python`` checker: any OpenAI-compatible chat-completions endpoint grades the answer.

A `Judge` is a callable checker object; a file beside the task file makes one and a task names it like any
user checker (``{"type": "python", "function": "judging.py:judge"}``)::

    from pathlib import Path
    from mcprl_env.judge import Judge

    judge = Judge(
        base_url="http://localhost:8000/v1",      # `vllm serve MODEL`, a local server, or a hosted API
        model="Qwen/Qwen3-8B",
        rubric=Path(__file__).with_name("rubric.md"),
        api_key_env="OPENAI_API_KEY",             # the variable's name: the key itself is never stored
    )

The rubric (a `string.Template` of ``$prompt``, ``$reference``, ``$answer``, ``$tool_calls``, ``$task_id``) is
sent as the user message after a fixed system message that asks for the verdict format; the strict verdict rule
is `mcprl_env.judge_rubric`'s.

Verdicts are cached by the request body (model, sampling settings, the rubric rendered with the task, the
answer and the tool calls it names), in memory and optionally in a JSONL file; identical judgments in flight at
once wait for the first.
Requests are bounded by ``max_concurrency`` per event loop, each by ``timeout_s``; HTTP 408/409/429/5xx,
transport errors, timeouts and malformed verdicts are retried ``max_retries`` times with exponential backoff.
What still fails raises `JudgeError`: the episode becomes invalid (``infra_error``), never a model failure.
`judge_metrics` drains the counters of every judge in the process (``judge/*`` keys, once per step).
"""

from __future__ import annotations

import hashlib
import json
import os
import ssl
import statistics
import string
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import attrs
import httpx
import structlog
import tenacity

from mcprl_env.errors import ConfigError, JudgeError
from mcprl_env.finished import FinishedEpisode
from mcprl_env.judge_rubric import (
    DEFAULT_RUBRIC,
    SYSTEM_PROMPT,
    Verdict,
    check_rubric,
    parse_verdict,
    render_tool_calls,
)

__all__ = ["DEFAULT_RUBRIC", "SYSTEM_PROMPT", "Judge", "Verdict", "judge_metrics", "parse_verdict"]

log = structlog.get_logger()

_RETRY_STATUS = frozenset({408, 409, 429})
_JUDGES: weakref.WeakSet[Judge] = weakref.WeakSet()


class _Retryable(Exception):
    """A failure worth another request (the message says which)."""


def _read_rubric(value: str | Path) -> str:
    return value.read_text(encoding="utf-8") if isinstance(value, Path) else value


def _check_rubric(_: Judge, __: attrs.Attribute[str], rubric: str) -> None:
    check_rubric(rubric)


def _check_url(_: Judge, __: attrs.Attribute[str], url: str) -> None:
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"judge base_url {url!r}: expected http(s)://host[:port]/v1")


def _check_key_env(_: Judge, __: attrs.Attribute[str | None], name: str | None) -> None:
    if name is not None and not os.environ.get(name):
        raise ConfigError(f"judge api_key_env: the environment variable {name} is not set (or empty)")


@attrs.define(kw_only=True, eq=False)
class Judge:
    """A checker that asks an OpenAI-compatible chat-completions endpoint whether the answer is correct.

    An episode without an answer is judged incorrect without a request.

    Attributes:
        base_url: The API root, ending in ``/v1`` (``POST {base_url}/chat/completions``).
        model: The model name the endpoint serves.
        rubric: The rubric text, or a `Path` to a file holding it (a `string.Template`; ``$answer`` required).
        api_key_env: Name of the environment variable holding the API key (sent as a bearer token); None for
            endpoints without authentication.
        max_concurrency: Requests in flight at once (per event loop).
        timeout_s: Seconds one request may take.
        max_retries: Further attempts after a retryable failure.
        backoff_s: First wait before a retry (doubled each time, up to ``max_backoff_s``).
        max_backoff_s: Longest wait before a retry.
        max_tokens: Completion tokens of a verdict.
        temperature: Sampling temperature of the judge.
        json_mode: Send ``response_format={"type": "json_object"}`` (vLLM and OpenAI accept it).
        extra_body: More fields of the request body, e.g. ``{"chat_template_kwargs": {"enable_thinking": False}}``
            for a Qwen3 model on vLLM (its verdict then comes without a long ``<think>`` block).
        tool_result_chars: Characters of each tool result shown under ``$tool_calls``.
        cache_path: A JSONL file of verdicts, read at start and appended to (None: in memory only).
    """

    base_url: str = attrs.field(validator=_check_url)
    model: str = attrs.field(validator=attrs.validators.min_len(1))
    rubric: str = attrs.field(default=DEFAULT_RUBRIC, converter=_read_rubric, validator=_check_rubric)
    api_key_env: str | None = attrs.field(default=None, validator=_check_key_env)
    max_concurrency: int = attrs.field(default=8, validator=attrs.validators.ge(1))
    timeout_s: float = attrs.field(default=60.0, validator=attrs.validators.gt(0))
    max_retries: int = attrs.field(default=3, validator=attrs.validators.ge(0))
    backoff_s: float = attrs.field(default=1.0, validator=attrs.validators.ge(0))
    max_backoff_s: float = attrs.field(default=30.0, validator=attrs.validators.ge(0))
    max_tokens: int = attrs.field(default=256, validator=attrs.validators.ge(1))
    temperature: float = attrs.field(default=0.0, validator=attrs.validators.ge(0))
    json_mode: bool = False
    extra_body: Mapping[str, object] = attrs.field(factory=dict[str, object], converter=dict[str, object])
    tool_result_chars: int = attrs.field(default=1000, validator=attrs.validators.ge(0))
    cache_path: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))
    _cache: dict[str, Verdict] = attrs.field(init=False, factory=dict[str, Verdict], repr=False)
    _pending: dict[str, anyio.Event] = attrs.field(init=False, factory=dict[str, anyio.Event], repr=False)
    _limiter: anyio.lowlevel.RunVar[anyio.CapacityLimiter] = attrs.field(init=False, repr=False)
    _ssl: ssl.SSLContext = attrs.field(init=False, factory=httpx.create_ssl_context, repr=False)
    _stats: _Stats = attrs.field(init=False, factory=lambda: _Stats(), repr=False)

    def __attrs_post_init__(self) -> None:
        self._limiter = anyio.lowlevel.RunVar(f"mcprl_judge_limiter_{id(self)}")
        if self.cache_path is not None and self.cache_path.is_file():
            self._cache.update(_load_cache(self.cache_path))
        _JUDGES.add(self)

    def __reduce__(self) -> tuple[object, ...]:
        """Pickled as its settings (tasks travel between ranks with their checker); unpickled as the live judge
        with the same settings when this process has one, so caches and counters stay in one place."""
        return (_judge_with, (self._settings(),))

    def _settings(self) -> dict[str, object]:
        return {a.name: getattr(self, a.name) for a in attrs.fields(Judge) if a.init}

    async def __call__(self, episode: FinishedEpisode) -> bool:
        """The checker: whether the judge finds the episode's answer correct.

        Raises:
            JudgeError: No verdict after the retries (the episode is then invalid, not wrong).
        """
        if episode.answer is None:
            return False
        return (await self.verdict(episode)).correct

    def request_messages(self, episode: FinishedEpisode) -> list[dict[str, str]]:
        """The chat messages sent for an episode: the system prompt and the rendered rubric."""
        task = episode.task
        prompt = task.prompt or "\n\n".join(
            str(m.get("content", "")) for m in task.messages if m.get("role") == "user"
        )
        fields = {
            "prompt": prompt,
            "reference": task.answer or "",
            "answer": episode.answer or "",
            "tool_calls": render_tool_calls(episode.tool_calls, self.tool_result_chars),
            "task_id": task.id,
        }
        user = string.Template(self.rubric).substitute(fields)
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]

    async def verdict(self, episode: FinishedEpisode) -> Verdict:
        """The verdict on an episode, from the cache or the endpoint (see the class docstring)."""
        body = self.request_body(self.request_messages(episode))
        key = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        self._stats.lookups += 1
        while (pending := self._pending.get(key)) is not None:
            await pending.wait()
        if (cached := self._cache.get(key)) is not None:
            self._stats.cache_hits += 1
            return cached
        done = self._pending[key] = anyio.Event()
        try:
            verdict = await self._ask(body, task_id=episode.task.id)
        finally:
            del self._pending[key]
            done.set()
        self._cache[key] = verdict
        if self.cache_path is not None:
            line = {"key": key, "model": self.model, "correct": verdict.correct, "reason": verdict.reason}
            with self.cache_path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")
        return verdict

    async def _ask(self, body: dict[str, object], *, task_id: str) -> Verdict:
        self._stats.calls += 1
        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(self.max_retries + 1),
            wait=tenacity.wait_exponential(multiplier=self.backoff_s, max=self.max_backoff_s),
            retry=tenacity.retry_if_exception_type(_Retryable),
            sleep=anyio.sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._request(body)
        except _Retryable as exc:
            self._stats.failures += 1
            log.error(
                "judge_error",
                task_id=task_id,
                model=self.model,
                attempts=self.max_retries + 1,
                error=str(exc),
            )
            raise JudgeError(
                f"no verdict from {self.base_url} after {self.max_retries + 1} attempts: {exc}"
            ) from exc
        except JudgeError as exc:
            self._stats.failures += 1
            log.error("judge_error", task_id=task_id, model=self.model, error=str(exc))
            raise
        raise AssertionError("unreachable: tenacity either returns or reraises")

    def _headers(self) -> dict[str, str]:
        if self.api_key_env is None:
            return {}
        key = os.environ.get(self.api_key_env)
        if not key:
            raise JudgeError(f"the environment variable {self.api_key_env} (the judge's API key) is not set")
        return {"Authorization": f"Bearer {key}"}

    def request_body(self, messages: list[dict[str, str]]) -> dict[str, object]:
        """The JSON body of a chat-completions request (also the cache key, hashed)."""
        body: dict[str, object] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }
        if self.json_mode:
            body["response_format"] = {"type": "json_object"}
        return {**body, **self.extra_body}

    async def _request(self, body: dict[str, object]) -> Verdict:
        url = f"{self.base_url.rstrip('/')}/chat/completions"
        limiter = self._limiter.get(None)
        if limiter is None:
            limiter = anyio.CapacityLimiter(self.max_concurrency)
            self._limiter.set(limiter)
        async with limiter:
            self._stats.requests += 1
            started = time.perf_counter()
            try:
                with anyio.fail_after(self.timeout_s):
                    # One TLS context per judge: building it is most of a fresh client's cost (~70 ms).
                    async with httpx.AsyncClient(timeout=self.timeout_s, verify=self._ssl) as client:
                        response = await client.post(url, json=body, headers=self._headers())
            except TimeoutError:
                raise _Retryable(f"timed out after {self.timeout_s:g} s") from None
            except httpx.TransportError as exc:
                raise _Retryable(f"{type(exc).__name__}: {exc}") from None
            latency = time.perf_counter() - started
        return self._read(response, latency)

    def _read(self, response: httpx.Response, latency: float) -> Verdict:
        status = response.status_code
        if status in _RETRY_STATUS or status >= 500:
            raise _Retryable(f"HTTP {status}: {response.text[:200]}")
        if status != 200:
            raise JudgeError(f"HTTP {status} from {response.url}: {response.text[:300]}")
        try:
            payload = response.json()
            content = payload["choices"][0]["message"]["content"]
            usage = payload.get("usage") or {}
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise _Retryable(f"not a chat completion ({type(exc).__name__}): {response.text[:200]}") from None
        self._stats.latencies.append(latency)
        self._stats.prompt_tokens += int(usage.get("prompt_tokens", 0))
        self._stats.completion_tokens += int(usage.get("completion_tokens", 0))
        try:
            return parse_verdict(str(content))
        except ValueError as exc:
            self._stats.malformed += 1
            raise _Retryable(f"malformed verdict: {exc}") from None

    def drain_stats(self) -> _Stats:
        """This judge's counters since the last drain (and a fresh set in their place)."""
        stats, self._stats = self._stats, _Stats()
        return stats


def _judge_with(settings: dict[str, Any]) -> Judge:
    for judge in list(_JUDGES):
        if judge._settings() == settings:
            return judge
    return Judge(**settings)


@attrs.define
class _Stats:
    lookups: int = 0
    cache_hits: int = 0
    calls: int = 0
    requests: int = 0
    failures: int = 0
    malformed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latencies: list[float] = attrs.field(factory=list[float])


def _load_cache(path: Path) -> dict[str, Verdict]:
    cache: dict[str, Verdict] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            row = json.loads(line)
            cache[str(row["key"])] = Verdict(correct=bool(row["correct"]), reason=str(row["reason"]))
        except (ValueError, KeyError, TypeError):
            log.warning("judge_cache_line_skipped", path=str(path), line=n)
    return cache


def _quantile(values: list[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def judge_metrics() -> dict[str, float]:
    """Drain every live judge's counters into ``judge/*`` metrics (empty when no judgment was asked for).

    Keys: ``judge/lookups`` (verdicts asked for), ``judge/cache_hits``, ``judge/cache_hit_rate``,
    ``judge/calls`` (verdicts asked of the endpoint), ``judge/requests`` (HTTP requests, retries included),
    ``judge/failures`` (calls that raised `JudgeError`), ``judge/malformed`` (unparseable replies),
    ``judge/latency_p50_s``, ``judge/latency_p95_s`` (per answered request), ``judge/prompt_tokens`` and
    ``judge/completion_tokens`` (totals of the endpoint's ``usage`` over every answered request, malformed
    verdicts included: what the endpoint bills for the step), ``judge/prompt_tokens_mean`` and
    ``judge/completion_tokens_mean`` (per answered request).
    """
    total = _Stats()
    for judge in list(_JUDGES):
        s = judge.drain_stats()
        total.lookups += s.lookups
        total.cache_hits += s.cache_hits
        total.calls += s.calls
        total.requests += s.requests
        total.failures += s.failures
        total.malformed += s.malformed
        total.prompt_tokens += s.prompt_tokens
        total.completion_tokens += s.completion_tokens
        total.latencies += s.latencies
    if total.lookups == 0:
        return {}
    out = {
        "judge/lookups": float(total.lookups),
        "judge/cache_hits": float(total.cache_hits),
        "judge/cache_hit_rate": total.cache_hits / total.lookups,
        "judge/calls": float(total.calls),
        "judge/requests": float(total.requests),
        "judge/failures": float(total.failures),
        "judge/malformed": float(total.malformed),
    }
    if answered := len(total.latencies):
        out["judge/latency_p50_s"] = statistics.median(total.latencies)
        out["judge/latency_p95_s"] = _quantile(total.latencies, 0.95)
        out["judge/prompt_tokens"] = float(total.prompt_tokens)
        out["judge/completion_tokens"] = float(total.completion_tokens)
        out["judge/prompt_tokens_mean"] = total.prompt_tokens / answered
        out["judge/completion_tokens_mean"] = total.completion_tokens / answered
    return out
