"""The statistics and the timing harness behind ``python -m mdlib bench``."""

import numpy as np

from mdlib import bench


def test_median_interval_brackets_the_median_and_covers_it():
    assert bench.median_interval([2.0] * 9) == (2.0, 2.0)
    rng = np.random.default_rng(0)
    sample = rng.normal(1.0, 0.1, 31)
    low, high = bench.median_interval(sample)
    assert low <= np.median(sample) <= high and high - low < 0.2
    # coverage of the true median (1.0) over repeated samples: about 95 %, allowing for the bootstrap's bias
    hits = [lo <= 1.0 <= hi for lo, hi in (bench.median_interval(rng.normal(1.0, 0.1, 31), resamples=500)
                                           for _ in range(200))]
    assert 0.85 <= np.mean(hits) <= 1.0


def test_optimizer_step_times_times_every_contender_each_round():
    rounds = bench.optimizer_step_times(2000, ps=(1.75,), repeats=2, modes=("eager",))
    assert set(rounds) == {"sgd_foreach", "sgd_fused", "adam_foreach", "adam_fused", "md_p1.75_eager"}
    assert all(len(t) == 2 and min(t) > 0 for t in rounds.values())
