"""Write this family's task files from the `search` server's documents (run once: `python make_tasks.py`).

Each earnings report in the corpus becomes a question about its net margin; the numbers stay on the server, so
the model has to fetch the document, and `margin_checks.grade` recomputes the truth from it.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from mcprl_servers.corpus import load_corpus

TITLE = re.compile(r"^(?P<company>.+) reports fiscal (?P<year>\d{4}) results$")
PROMPT = (
    "What was {company}'s net margin in fiscal {year} (net income as a percentage of revenue)? Find the "
    "figures with the search tools, compute the margin with run_python, and reply with the percentage rounded "
    "to one decimal, like <answer>12.3</answer>."
)


def main() -> None:
    tasks = []
    for doc in load_corpus():
        match = TITLE.match(doc["title"])
        if doc["meta"].get("kind") != "earnings" or match is None:
            continue
        tasks.append(
            {
                "id": f"net-margin-{doc['doc_id']}",
                "prompt": PROMPT.format(**match.groupdict()),
                "servers": ["search", "python"],
                "difficulty": "medium",
                "checker": {"type": "python", "function": "margin_checks.py:grade"},
                "metadata": {"family": "net_margin", "doc_id": doc["doc_id"]},
            }
        )
    random.Random(0).shuffle(tasks)
    here = Path(__file__).parent
    for name, part in (("train.jsonl", tasks[:90]), ("validation.jsonl", tasks[90:])):
        (here / name).write_text("".join(json.dumps(t) + "\n" for t in part), encoding="utf-8")


if __name__ == "__main__":
    main()
