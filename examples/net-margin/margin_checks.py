"""The net-margin family's checker and a reward term: plain Python, called by mcprl with the whole episode."""

from __future__ import annotations

import json
import re

from mcprl_env import FinishedEpisode, extract_number

FIGURES = re.compile(
    r"revenue of \$(?P<revenue>[\d,.]+) million and net income of \$(?P<income>[\d,.]+) million"
)


async def grade(episode: FinishedEpisode) -> bool:
    """Correct when the episode fetched the task's document and answered its net margin to 0.05 points.

    The truth is read from the search server (through ``episode.manager``), not stored in the task file. An
    exception here (the server down, a document without figures) makes the episode invalid, never wrong.
    """
    doc_id = episode.task.metadata["doc_id"]
    fetched = any(
        call.ok and call.name.endswith("fetch_document") and doc_id in call.result
        for call in episode.tool_calls
    )
    answer = extract_number(episode.answer or "")
    if not fetched or answer is None:
        return False
    result = await episode.manager.call(
        "search.fetch_document", {"doc_id": doc_id}, episode_id=episode.episode_id
    )
    if result.kind != "ok":
        raise RuntimeError(f"search.fetch_document({doc_id!r}) failed: {result.text}")
    figures = FIGURES.search(json.loads(result.text)["text"])
    if figures is None:
        raise ValueError(f"{doc_id} states no revenue and net income")
    revenue, income = (float(figures[k].replace(",", "")) for k in ("revenue", "income"))
    return abs(answer - 100 * income / revenue) <= 0.05


def used_python(episode: FinishedEpisode) -> float:
    """A reward term: 1 when a run_python call of the episode succeeded, else 0."""
    return float(any(call.ok and call.name.endswith("run_python") for call in episode.tool_calls))
