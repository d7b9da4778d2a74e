"""Call metrics: counts by scope and kind, nearest-rank latency percentiles."""

from __future__ import annotations

import pytest

from mcprl_tools.metrics import CallMetrics


def test_counts_and_percentiles_per_scope() -> None:
    metrics = CallMetrics()
    for ms in range(1, 101):
        metrics.record(server="s", tool="s.t", error_type=None, latency_s=ms / 1000)
    metrics.record(server=None, tool="nope", error_type="unknown_tool", latency_s=0.0)
    snap = metrics.snapshot([("tools/s/restarts", 2.0)])
    assert snap["tools/calls"] == 101
    assert snap["tools/s/calls"] == 100
    assert snap["tools/s/latency_p50_ms"] == pytest.approx(50.0, abs=1.0)
    assert snap["tools/s/latency_p95_ms"] == pytest.approx(95.0, abs=1.0)
    assert snap["tools/errors/unknown_tool"] == 1
    assert snap["tools/tool/nope/error_rate"] == 1.0
    assert snap["tools/s/error_rate"] == 0.0
    assert snap["tools/s/restarts"] == 2.0
