"""Call metrics per server and tool (counts, errors by kind, latency percentiles) and per-step windows."""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable, Mapping

_WINDOW = 4096
_LIFECYCLE = ("restarts", "crashes", "unavailable_periods")


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return 0.0
    rank = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[rank]


class CallMetrics:
    """Accumulates outcomes of tool calls; latency percentiles over the last 4,096 calls per scope."""

    def __init__(self) -> None:
        self._counts: defaultdict[str, float] = defaultdict(float)
        self._latency: defaultdict[str, deque[float]] = defaultdict(lambda: deque(maxlen=_WINDOW))

    def record(self, *, server: str | None, tool: str, error_type: str | None, latency_s: float) -> None:
        """Count one finished call under `tools/`, `tools/<server>/` and `tools/tool/<tool>/`."""
        scopes = ["tools", f"tools/tool/{tool}"]
        if server is not None:
            scopes.append(f"tools/{server}")
        for scope in scopes:
            self._counts[f"{scope}/calls"] += 1
            if error_type is not None:
                self._counts[f"{scope}/errors"] += 1
                self._counts[f"{scope}/errors/{error_type}"] += 1
            self._latency[scope].append(latency_s)

    def snapshot(self, gauges: Iterable[tuple[str, float]] = ()) -> dict[str, float]:
        """All metrics as `dict[str, float]`, with `gauges` (restarts, in-flight) merged in."""
        out = dict(self._counts)
        for scope, values in self._latency.items():
            ordered = sorted(values)
            out[f"{scope}/latency_p50_ms"] = _percentile(ordered, 0.50) * 1000
            out[f"{scope}/latency_p95_ms"] = _percentile(ordered, 0.95) * 1000
            calls = out.get(f"{scope}/calls", 0.0)
            out[f"{scope}/error_rate"] = out.get(f"{scope}/errors", 0.0) / calls if calls else 0.0
        out.update(gauges)
        return out


class StepWindow:
    """Infrastructure events since the last `take`, for a trainer's once-per-step metrics line.

    Keys (all under `tools/step/`): `calls`, `infra_errors`, `timeouts`, `crashed_calls`, `unavailable_calls`,
    `restarts`, `crashes`, `unavailable_periods`, `queue_wait_mean_ms`, `queue_wait_max_ms`, and per server
    `<server>/restarts`, `<server>/crashes`, `<server>/timeouts`, `<server>/queue_wait_max_ms`. Queue wait is
    the time a call waited for a free slot under the server's `max_concurrency`.
    """

    def __init__(self) -> None:
        self._counts: defaultdict[str, float] = defaultdict(float)
        self._wait_sum = 0.0
        self._wait_n = 0
        self._wait_max: defaultdict[str, float] = defaultdict(float)
        self._last_totals: dict[str, int] = {}

    def record(self, *, server: str | None, error_type: str | None, infra: bool) -> None:
        """Count one finished call."""
        self._counts["calls"] += 1
        self._counts["infra_errors"] += float(infra)
        match error_type:
            case "timeout":
                self._counts["timeouts"] += 1
                if server is not None:
                    self._counts[f"{server}/timeouts"] += 1
            case "crashed":
                self._counts["crashed_calls"] += 1
            case "unavailable":
                self._counts["unavailable_calls"] += 1
            case _:
                pass

    def queue_wait(self, server: str, seconds: float) -> None:
        """Record how long one call waited for a slot on `server`."""
        self._wait_sum += seconds
        self._wait_n += 1
        self._wait_max[server] = max(self._wait_max[server], seconds)

    def take(self, totals: Mapping[str, Mapping[str, int]]) -> dict[str, float]:
        """The window's metrics, then start a new window.

        Args:
            totals: Running totals of `_LIFECYCLE` events per server (`{server: {"restarts": 3, ...}}`),
                reported as their differences from the previous window.
        """
        out = {f"tools/step/{key}": value for key, value in self._counts.items()}
        for event in ("calls", "infra_errors", "timeouts", "crashed_calls", "unavailable_calls"):
            out.setdefault(f"tools/step/{event}", 0.0)
        for event in _LIFECYCLE:
            out[f"tools/step/{event}"] = 0.0
        for server, events in totals.items():
            for event, total in events.items():
                key = f"{server}/{event}"
                delta = float(total - self._last_totals.get(key, 0))
                self._last_totals[key] = total
                out[f"tools/step/{event}"] += delta
                if event != "unavailable_periods":
                    out[f"tools/step/{key}"] = delta
        out["tools/step/queue_wait_mean_ms"] = 1000 * self._wait_sum / self._wait_n if self._wait_n else 0.0
        out["tools/step/queue_wait_max_ms"] = 1000 * max(self._wait_max.values(), default=0.0)
        for server, longest in self._wait_max.items():
            out[f"tools/step/{server}/queue_wait_max_ms"] = 1000 * longest
        self._counts.clear()
        self._wait_sum, self._wait_n = 0.0, 0
        self._wait_max.clear()
        return out
