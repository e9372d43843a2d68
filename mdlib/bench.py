"""Benchmarks behind ``python -m mdlib bench ...``; each returns a JSON-serializable dict.

Timings on shared 2-core machines are noisy: each benchmark interleaves the contenders, repeats,
and reports medians and ratios measured side by side in one run.
"""

from __future__ import annotations

import os
import statistics
import time

# OpenMP threads spin while waiting; a passive policy keeps a neighbour's load from distorting timings.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def median_time(fn, repeats: int) -> float:
    """Median wall time of ``fn()`` over ``repeats`` calls, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
