"""Write train.jsonl and validation.jsonl from the demo's quote tasks (run from this directory)."""

import json
from pathlib import Path

from mcprl_tasks import load_preset, read_tasks


def write(split: str, n: int, judged_from: int) -> None:
    train, validation = load_preset("demo")
    source = train if split == "train" else validation
    tasks = [t for t in read_tasks(source) if t["metadata"]["family"] == "quote"][:n]
    for task in tasks[judged_from:]:
        task["checker"] = {"type": "python", "function": "judging.py:judge"}
        task["metadata"]["family"] = "judged_quote"
    Path(f"{split}.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))


if __name__ == "__main__":
    write("train", 160, judged_from=80)
    write("validation", 8, judged_from=0)
