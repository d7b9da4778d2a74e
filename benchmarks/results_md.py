"""Replace one benchmark's section of ``benchmarks/RESULTS.md`` (shared by every ``bench_*.py``).

A section runs from its ``## <name>`` heading line to the next ``## `` heading (or the end of the file). Each
benchmark owns exactly one section; the others are left untouched. The file is rewritten atomically.
"""

from __future__ import annotations

import os
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")


def replace_section(section: str, path: Path = RESULTS) -> None:
    """Put ``section`` (its first line is the ``## <name>`` heading) in place of that section, or append it."""
    heading = section.lstrip("\n").splitlines()[0].strip()
    if not heading.startswith("## "):
        raise ValueError(f"a section starts with a '## <name>' heading, got {heading!r}")
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmark results\n"
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.strip() == heading), None)
    body = section.strip("\n").splitlines()
    if start is None:
        new = [*lines, "", *body]
    else:
        end = next((j for j in range(start + 1, len(lines)) if lines[j].startswith("## ")), len(lines))
        new = [*lines[:start], *body, *([""] if end < len(lines) else []), *lines[end:]]
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text("\n".join(new).rstrip("\n") + "\n", encoding="utf-8")
    os.replace(tmp, path)
