"""Call metrics per server and tool: counts, errors by kind, latency percentiles, restarts."""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable

_WINDOW = 4096


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
