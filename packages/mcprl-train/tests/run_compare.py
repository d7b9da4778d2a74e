"""Two finished runs compared: what differs between their run directories, clock readings aside.

`run_differences` is how the reproducibility checks (two continuations of a checkpoint, a run killed and
resumed, `kill_resume`) decide that two runs are the same run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from mcprl_train.run.checkpoint import MANIFEST
from mcprl_train.run.run_dir import RunDir, read_jsonl

__all__ = ["is_timing", "max_logprob_gap", "run_differences"]

_TIMING = ("time", "time/", "perf/", "wall_s", "elapsed_s")


def is_timing(key: str) -> bool:
    """A clock reading (``time/*``, ``perf/*``, ``*_s``, ``*_ms``, ``*_s_mean``): the one thing two equal runs may
    differ in."""
    return key.startswith(_TIMING) or key.endswith(("_s", "_ms", "_s_mean"))


def run_differences(a: Path, b: Path, *, exact: bool = True) -> list[str]:
    """What differs between two finished runs, clock readings and run names aside (empty: equal).

    Compares every ``metrics.jsonl`` record in order, every episode of ``trajectories.jsonl`` (keyed by step,
    episode id and attempt), ``summary.json`` and the final checkpoint's policy weight files (their sha256 in
    the checkpoint's manifest).

    Args:
        exact: Bit for bit. Otherwise what the sampler's batching decides is compared as runs that batch
            differently agree (benchmarks/RESULTS.md, "reproducible sampling"): its counters (``sampler/*``)
            not at all, the sampler's logprobs within 1e-4 and the metrics computed from them (``mismatch/*``)
            within 1e-3 relative; tokens, messages, rewards, every other metric and the weights still bit for
            bit. Which requests share a forward pass depends on when they arrive, and on the CPU a row's
            logits change in their last bits with the batch's padding.
    """
    out: list[str] = []
    ma, mb = (_metrics(p, exact=exact) for p in (a, b))
    if len(ma) != len(mb):
        out.append(f"metrics: {len(ma)} vs {len(mb)} records")
    for i, (x, y) in enumerate(zip(ma, mb, strict=False)):
        keys = sorted(k for k in x.keys() | y.keys() if not _same(x.get(k), y.get(k), close=_close(k, exact)))
        if keys:
            out.append(f"metrics record {i} ({x.get('kind')} step {x.get('step')}): {keys[:5]}")
    ea, eb = (_episodes(p) for p in (a, b))
    if sorted(ea) != sorted(eb):
        out.append(f"episodes: {len(ea)} vs {len(eb)}, {len(set(ea) ^ set(eb))} not in both")
    differing = [k for k in ea if k in eb and not _same_episode(ea[k], eb[k], exact=exact)]
    if differing:
        out.append(f"{len(differing)} episodes differ, e.g. {differing[:3]}")
    sa, sb = (_summary(p) for p in (a, b))
    if sa != sb:
        out.append(f"summary: {sorted(k for k in sa.keys() | sb.keys() if sa.get(k) != sb.get(k))}")
    out.extend(_weight_differences(a, b))
    return out


def max_logprob_gap(a: Path, b: Path) -> float:
    """The largest |difference| between the sampler's logprobs of the same token in two runs' episodes (the
    episodes both runs hold, with as many logprobs in each; 0.0 when none)."""
    ea, eb = _episodes(a), _episodes(b)
    gaps = [
        abs(p - q)
        for k in ea.keys() & eb.keys()
        if len(lx := ea[k].get("sampler_logprobs") or []) == len(ly := eb[k].get("sampler_logprobs") or [])
        for p, q in zip(lx, ly, strict=True)
    ]
    return max(gaps, default=0.0)


def _metrics(run: Path, *, exact: bool) -> list[dict[str, Any]]:
    def kept(key: str) -> bool:
        return key != "run" and not is_timing(key) and (exact or not key.startswith("sampler/"))

    return [{k: v for k, v in r.items() if kept(k)} for r in _records(run, "metrics")]


def _close(key: str, exact: bool) -> bool:
    return not exact and key.startswith("mismatch/")


def _same(x: object, y: object, *, close: bool) -> bool:
    if close and isinstance(x, float) and isinstance(y, float):
        return math.isclose(x, y, rel_tol=1e-3, abs_tol=1e-5)
    return x == y


def _same_episode(x: dict[str, Any], y: dict[str, Any], *, exact: bool) -> bool:
    if exact:
        return x == y
    lx: list[float] = x.get("sampler_logprobs") or []
    ly: list[float] = y.get("sampler_logprobs") or []
    if len(lx) != len(ly) or any(abs(p - q) > 1e-4 for p, q in zip(lx, ly, strict=True)):
        return False
    return {k: v for k, v in x.items() if k != "sampler_logprobs"} == {
        k: v for k, v in y.items() if k != "sampler_logprobs"
    }


def _episodes(run: Path) -> dict[tuple[int, str, int], dict[str, Any]]:
    out: dict[tuple[int, str, int], dict[str, Any]] = {}
    for r in _records(run, "trajectories"):
        metrics: Mapping[str, Any] = r.get("metrics") or {}
        record = {k: v for k, v in r.items() if k != "run"}
        record["metrics"] = {k: v for k, v in metrics.items() if not is_timing(k)}
        out[(int(r["step"]), str(r["episode_id"]), int(r.get("attempt") or 0))] = record
    return out


def _records(run: Path, name: Literal["metrics", "trajectories"]) -> list[dict[str, Any]]:
    result = read_jsonl(run / f"{name}.jsonl")
    if result.torn_line is not None or result.bad_lines:
        raise RuntimeError(f"{run.name}/{name}.jsonl has a torn or corrupt line after the run finished")
    return result.records


def _summary(run: Path) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((run / "summary.json").read_text())
    return {k: v for k, v in summary.items() if k not in ("run_dir", "resumed_from") and not is_timing(k)}


def _weight_differences(a: Path, b: Path) -> list[str]:
    ca, cb = (RunDir.open(p).checkpoints.load_latest() for p in (a, b))
    if ca is None or cb is None:
        return [f"final checkpoint: {ca is not None} vs {cb is not None}"]
    out: list[str] = []
    state_a, state_b = ({k: v for k, v in c.meta["state"].items() if k != "elapsed_s"} for c in (ca, cb))
    if state_a != state_b:
        out.append(f"final checkpoint state: {state_a} vs {state_b}")
    wa, wb = (_weight_hashes(c.path) for c in (ca, cb))
    if not wa or wa != wb:
        out.append(
            f"final weights differ: {sorted(k for k in wa.keys() | wb.keys() if wa.get(k) != wb.get(k))}"
        )
    return out


def _weight_hashes(checkpoint: Path) -> dict[str, str]:
    """The sha256 of each policy weight file, from the checkpoint's verified manifest."""
    files: dict[str, dict[str, Any]] = json.loads((checkpoint / MANIFEST).read_text())["files"]
    return {
        k: str(v["sha256"])
        for k, v in files.items()
        if k.startswith("policy/") and k.endswith(".safetensors")
    }
