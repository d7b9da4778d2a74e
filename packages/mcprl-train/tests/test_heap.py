"""`trim_heap`: memory torch freed inside glibc's heap goes back to the OS (the process's RSS falls)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# Run in a process of its own: the heap's state is the test's subject. After one large tensor is freed, glibc
# raises its mmap threshold, so the next 4 MiB tensors come from the heap; freeing all but the last leaves them
# in the heap (the last one pins its top, so free() cannot give them back by itself).
_PROGRAM = textwrap.dedent(
    """
    import os, torch
    from mcprl_train.run.heap import trim_heap

    def rss_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    del_me = torch.ones(8 << 20, dtype=torch.uint8)
    del del_me
    held = [torch.ones(4 << 20, dtype=torch.uint8) for _ in range(100)]
    last = held[-1]
    del held
    before = rss_mib()
    returned = trim_heap()
    print(returned, round(before), round(rss_mib()))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim and /proc are Linux's")
def test_freed_tensors_left_in_the_heap_go_back_to_the_os() -> None:
    done = subprocess.run([sys.executable, "-c", _PROGRAM], capture_output=True, text=True, check=True)
    returned, before, after = done.stdout.split()
    assert returned == "True"
    assert int(before) - int(after) > 300, done.stdout  # most of the 99 freed 4 MiB tensors
