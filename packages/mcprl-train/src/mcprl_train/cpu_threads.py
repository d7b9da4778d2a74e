"""torch's CPU threads against the machine's load: a warning when they would spin against other processes.

torch runs its CPU kernels on an OpenMP pool of ``torch.get_num_threads()`` threads (one per core by default).
When other processes already keep every core busy, those threads wait for each other at each parallel
region's barrier while the scheduler runs someone else: on the shared 2-core machines of
``benchmarks/RESULTS.md`` an SFT step took 50-60 s with 2 threads and 3-5 s with one (load 15-18). One thread
per process is then the faster choice. The user makes it (``OMP_NUM_THREADS=1``); mcprl only says so, at the
start of a CPU run and in ``mcprl-train doctor``, because the load can change during a run and a thread count
set behind the user's back would surprise them on an idle machine.
"""

from __future__ import annotations

import os

import attrs

__all__ = ["ThreadLoad"]


@attrs.frozen(kw_only=True)
class ThreadLoad:
    """torch's intra-op threads, the cores this process may run on, and the 1-minute load average."""

    threads: int
    cores: int
    load: float

    @classmethod
    def measure(cls) -> ThreadLoad:
        import torch

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return cls(threads=torch.get_num_threads(), cores=cores, load=os.getloadavg()[0])

    @property
    def contended(self) -> bool:
        """More than one thread while other processes already fill every core."""
        return self.threads > 1 and self.load >= self.cores

    def describe(self) -> str:
        """One line: the numbers, and the fix when the threads are contended."""
        found = f"{self.threads} torch threads, load {self.load:.1f} on {self.cores} cores"
        if not self.contended:
            return found
        return (
            f"{found}: the machine is busy and torch's threads will spin against other processes "
            "(a step can be 10-100x slower); run with OMP_NUM_THREADS=1"
        )
