"""The statistics and the timing harness behind ``python -m mdlib bench``, and what its reports mean."""

import inspect
import json
import re
import statistics
from types import SimpleNamespace

import numpy as np
import pytest

from mdlib.book import bench


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


def test_choice_names_the_parameter_the_value_and_the_allowed_values():
    assert bench.choice("vit", "tiny", ("paper", "tiny")) == "tiny"
    with pytest.raises(ValueError, match=r"^parameter 'vit': 'bogus' is not one of 'paper', 'tiny'; give one of them$"):
        bench.choice("vit", "bogus", ("paper", "tiny"))
    with pytest.raises(ValueError, match=re.escape("'modes': ['default'] is not one of 'default', 'foreach', 'fused'")):
        bench.choice("modes", ["default"], bench.MD_MODES)


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


def _record(monkeypatch, module, name, **overrides):
    """Replace ``module.name`` by a wrapper that calls it with ``overrides`` (tiny sizes) and records
    each call's arguments as the caller gave them (by name) and the result."""
    original = getattr(module, name)
    signature = inspect.signature(original)
    calls = []

    def wrapper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        requested = dict(bound.arguments)
        bound.arguments.update(overrides)
        result = original(*bound.args, **bound.kwargs)
        calls.append({"arguments": requested, "result": result})
        return result
    monkeypatch.setattr(module, name, wrapper)
    return calls


def _positive_finite(x):
    return isinstance(x, float) and np.isfinite(x) and x > 0


def _check_ratio_entry(entry, samples, reference, target):
    """A reported ratio: the median over rounds of the round-by-round ratio, inside its interval,
    judged against its target."""
    ratios = [a / b for a, b in zip(samples, reference)]
    assert _positive_finite(entry["median_ratio"])
    assert entry["median_ratio"] == round(statistics.median(ratios), 3)
    low, high = entry["ci95"]
    assert round(min(ratios), 3) <= low <= entry["median_ratio"] <= high <= round(max(ratios), 3)
    assert entry["target"] == target and entry["met"] == (statistics.median(ratios) <= target)


def test_optimizer_benchmark_reports_the_medians_and_ratios_of_what_it_timed(monkeypatch):
    import torch

    steps = _record(monkeypatch, bench, "optimizer_step_times", total=3000, ps=(1.75,), modes=("default",))
    training = _record(monkeypatch, bench, "training_step_times")
    out = bench.optimizer(SimpleNamespace(repeats=2))
    json.dumps(out)  # what the CLI prints

    (call,) = steps
    assert out["params"] == call["arguments"]["total"]  # the size it asked for is the size it reports
    assert out["repeats"] == 2 == call["arguments"]["repeats"]
    assert out["torch"] == torch.__version__ and out["threads"] == torch.get_num_threads()
    rounds = call["result"]
    assert set(out["step_ms_median"]) == set(rounds) == {*bench.TORCH_CONTENDERS, "md_p1.75_default"}
    for name, seconds in rounds.items():
        assert len(seconds) == 2
        ms = out["step_ms_median"][name]
        assert ms == round(1e3 * statistics.median(seconds), 2)
        assert round(1e3 * min(seconds), 2) <= ms <= round(1e3 * max(seconds), 2)
    assert set(out["step_ratios"]) == {"md_p1.75_default"}
    entry = out["step_ratios"]["md_p1.75_default"]
    assert entry["vs"] == "adam_default"
    _check_ratio_entry(entry, rounds["md_p1.75_default"], rounds["adam_default"], bench.STEP_TARGETS["default"][1])

    assert [c["arguments"]["which"] for c in training] == list(bench.TRAINING_MODELS) == list(out["training_steps"])
    for call in training:
        assert call["arguments"]["repeats"] == 2
        times, report = call["result"], out["training_steps"][call["arguments"]["which"]]
        assert set(times) == set(bench.TRAINING_OPTIMIZERS)
        assert report["step_ms_median"] == {k: round(1e3 * statistics.median(v), 2) for k, v in times.items()}
        assert set(report) == {"step_ms_median"} | {f"{k} / adam" for k in times if k != "adam"}
        for name in times:
            if name != "adam":
                _check_ratio_entry(report[f"{name} / adam"], times[name], times["adam"], bench.TRAINING_TARGET)
    mets = [entry["met"]] + [v["met"] for t in out["training_steps"].values()
                             for k, v in t.items() if k != "step_ms_median"]
    assert out["all_targets_met"] == all(mets)


def test_svm_benchmark_reports_certified_solutions_and_consistent_speedups():
    out = bench.svm(SimpleNamespace(repeats=1))
    json.dumps(out)
    assert out["problem"] == {"n": 6, "T": 8, "d": 10, "constraints": 42, "unknowns": 100}
    assert out["batch"] == 100 and out["cvxpy_problems"] == 5 and out["repeats"] == 1
    assert set(out["results"]) == {"p=1.1", "p=1.75", "p=2", "p=3"}
    for r in out["results"].values():
        cvx, single, batched = (r[f"{k}_ms_per_problem"] for k in ("cvxpy_clarabel", "single", "batched"))
        assert all(_positive_finite(x) for x in (cvx, single, batched, r["speedup_batched"], r["speedup_single"]))
        # one repeat: the median of the ratios is the ratio of the reported times
        assert r["speedup_batched"] == pytest.approx(cvx / batched, rel=1e-9)
        assert r["speedup_single"] == pytest.approx(cvx / single, rel=1e-9)
        assert 0 <= r["max_rel_gap"] <= 1e-8 and 0 <= r["max_violation"] <= 1e-8
        assert r["median_iterations"] >= 1
        assert 0 <= r["max_norm_rel_diff_vs_cvxpy"] < 1e-4  # our optimal norms agree with cvxpy's
    assert out["target_100x_cvxpy_every_p"] == all(r["speedup_batched"] >= 100 for r in out["results"].values())


def test_synthetic_benchmark_reports_the_final_divergences_of_the_run(monkeypatch):
    from mdlib.experiments import synthetic

    original, calls = synthetic.fixed_decoder_experiment, []

    def tiny(config, **kwargs):  # the benchmark's config, run at 40 steps per p
        result = original(dict(config, steps={p: 40 for p in config["steps"]}), **kwargs)
        calls.append({"config": config, "options": kwargs, "result": result})
        return result
    monkeypatch.setattr(synthetic, "fixed_decoder_experiment", tiny)
    out = bench.synthetic(SimpleNamespace(seeds=2))
    json.dumps(out)
    (call,) = calls
    assert call["config"]["seeds"] == 2 == out["seeds"] and call["options"] == {"cache": False}  # timed, not stored
    assert call["config"]["steps"] == {"1.75": 1500, "2": 2000, "3": 20000}  # the paper's step counts
    assert call["config"]["svm_ps"] == [1.75, 2.0, 3.0] and _positive_finite(out["seconds"])
    final = call["result"]["final"]
    assert set(final.seed) == {0, 1}
    means = final.groupby(["train_p", "svm_p"]).divergence.mean()
    table = out["final_divergence"]
    assert list(table) == ["1.75", "2", "3"] and all(list(row) == ["1.75", "2", "3"] for row in table.values())
    for p, row in table.items():
        for q, value in row.items():
            assert value >= 0 and value == round(float(means[(float(p), float(q))]), 6)
    assert out["own_svm_smallest_on_every_path"] == all(min(row, key=row.get) == p for p, row in table.items())


def test_training_benchmark_times_the_fast_path_against_torch_kernels(fixture_data, monkeypatch):
    """On the fixture sentences (one batch): every contender timed each round, the reference ones under
    torch's own kernels, and the report's speedups are the medians of the round-by-round ratios."""
    from mdlib import models

    used = []
    original_kernels, original_times = models.reference_kernels, bench.kernel_step_times

    def spy():
        used.append(True)
        return original_kernels()

    record = []

    def one_batch(repeats):
        record.append(original_times(repeats=repeats, batches=1))
        return record[-1]

    monkeypatch.setattr(models, "reference_kernels", spy)
    monkeypatch.setattr(bench, "kernel_step_times", one_batch)
    out = bench.training(SimpleNamespace(repeats=2))
    json.dumps(out)
    (times,) = record
    assert set(times) == {"md_p1.1_fast", "gd_fast", "md_p1.1_reference", "gd_reference"}
    assert all(len(v) == 2 for v in times.values()) and used  # the reference rounds ran under torch's kernels
    for name in ("md_p1.1", "gd"):
        ratios = [a / b for a, b in zip(times[f"{name}_reference"], times[f"{name}_fast"])]
        entry = out["speedup_vs_reference_kernels"][name]
        assert entry["median_speedup"] == round(statistics.median(ratios), 3)
        assert entry["met"] == (statistics.median(ratios) >= bench.KERNELS_TARGET)
    assert out["all_targets_met"] == all(v["met"] for v in out["speedup_vs_reference_kernels"].values())
