"""The statistics and the timing harness behind ``python -m mdlib bench``."""

import numpy as np
import pytest

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
    rounds = bench.optimizer_step_times(2000, ps=(1.75,), repeats=2, modes=("default", "foreach"))
    assert set(rounds) == {*bench.TORCH_CONTENDERS, "md_p1.75_default", "md_p1.75_foreach"}
    assert all(len(t) == 2 and min(t) > 0 for t in rounds.values())
    ratios = bench.step_ratios(rounds)
    assert set(ratios) == {"md_p1.75_default"}  # foreach has no target of its own
    assert ratios["md_p1.75_default"]["vs"] == "adam_default" and ratios["md_p1.75_default"]["target"] == 1.0


def test_step_ratios_are_medians_of_round_by_round_ratios():
    rounds = {"adam_fused": [1.0, 2.0, 4.0], "md_p3_fused": [1.0, 3.0, 4.0]}
    r = bench.step_ratios(rounds)["md_p3_fused"]
    assert r["median_ratio"] == 1.0 and r["target"] == 1.10 and r["met"]


@pytest.mark.parametrize("which", bench.TRAINING_MODELS)
def test_training_step_times_build_the_chapters_models_and_optimizers(which):
    rounds = bench.training_step_times(which, repeats=1, optimizers={
        "adam": ("adam", 1e-4, None), "md_p1.1": ("md", 1e-4, 1.1)})
    assert set(rounds) == {"adam", "md_p1.1"} and all(len(t) == 1 and t[0] > 0 for t in rounds.values())
