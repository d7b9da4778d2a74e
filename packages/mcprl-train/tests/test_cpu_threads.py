"""`ThreadLoad`: when torch's CPU threads would spin against other processes, and what the user is told."""

from __future__ import annotations

import os

import torch

from mcprl_train.cpu_threads import ThreadLoad


def test_contended_only_with_several_threads_on_full_cores() -> None:
    assert ThreadLoad(threads=2, cores=2, load=15.3).contended
    assert ThreadLoad(threads=2, cores=2, load=2.0).contended
    assert not ThreadLoad(threads=2, cores=2, load=1.1).contended
    assert not ThreadLoad(threads=1, cores=2, load=15.3).contended
    assert not ThreadLoad(threads=16, cores=16, load=8.0).contended


def test_describe_names_the_numbers_and_the_fix_only_when_contended() -> None:
    busy = ThreadLoad(threads=2, cores=2, load=15.25).describe()
    assert busy.startswith("2 torch threads, load 15.2 on 2 cores: ")
    assert "OMP_NUM_THREADS=1" in busy
    idle = ThreadLoad(threads=2, cores=2, load=0.5).describe()
    assert idle == "2 torch threads, load 0.5 on 2 cores"


def test_measure_reads_this_process_and_machine() -> None:
    measured = ThreadLoad.measure()
    assert measured.threads == torch.get_num_threads()
    assert measured.cores == len(os.sched_getaffinity(0))
    assert abs(measured.load - os.getloadavg()[0]) < 5.0
