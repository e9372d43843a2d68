"""The statistics and the timing harness (``mdlib.experiments.cost``) behind ``python -m mdlib bench`` and chapter
08's tables, and what the reports mean."""

import inspect
import json
import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from mdlib.book import bench
from mdlib.experiments import cost
from mdlib.runs.identity import RunId


def test_median_interval_brackets_the_median_and_covers_it():
    assert cost.median_interval([2.0] * 9) == (2.0, 2.0)
    rng = np.random.default_rng(0)
    sample = rng.normal(1.0, 0.1, 31)
    low, high = cost.median_interval(sample)
    assert low <= np.median(sample) <= high and high - low < 0.2
    # coverage of the true median (1.0) over repeated samples: about 95 %, allowing for the bootstrap's bias
    hits = [lo <= 1.0 <= hi for lo, hi in (cost.median_interval(rng.normal(1.0, 0.1, 31), resamples=500)
                                           for _ in range(200))]
    assert 0.85 <= np.mean(hits) <= 1.0


def test_choice_names_the_parameter_the_value_and_the_allowed_values():
    assert cost.choice("vit", "tiny", ("paper", "tiny")) == "tiny"
    with pytest.raises(ValueError, match=r"^parameter 'vit': 'bogus' is not one of 'paper', 'tiny'; give one of them$"):
        cost.choice("vit", "bogus", ("paper", "tiny"))
    with pytest.raises(ValueError, match=re.escape("'modes': ['default'] is not one of 'default', 'foreach', 'fused'")):
        cost.choice("modes", ["default"], cost.MD_MODES)


def test_sparse_embedding_step_times_train_chapter_04s_model_both_ways():
    rounds = bench.sparse_embedding_step_times(repeats=1)
    assert set(rounds) == {"dense", "sparse"} and all(len(t) == 1 and t[0] > 0 for t in rounds.values())


def test_optimizer_step_times_times_every_contender_each_round():
    rounds = cost.optimizer_step_times(2000, ps=(1.75,), repeats=2, modes=("default", "foreach"))
    assert set(rounds) == {*cost.TORCH_CONTENDERS, "md_p1.75_default", "md_p1.75_foreach"}
    assert all(len(t) == 2 and min(t) > 0 for t in rounds.values())
    ratios = cost.step_ratios(rounds)
    assert set(ratios) == {"md_p1.75_default"}  # foreach has no target of its own
    assert ratios["md_p1.75_default"]["vs"] == "adam_default" and ratios["md_p1.75_default"]["target"] == 1.0


def test_step_ratios_are_medians_of_round_by_round_ratios():
    rounds = {"adam_fused": [1.0, 2.0, 4.0], "md_p3_fused": [1.0, 3.0, 4.0]}
    r = cost.step_ratios(rounds)["md_p3_fused"]
    assert r["median_ratio"] == 1.0 and r["target"] == 1.10 and r["met"]


@pytest.mark.parametrize("which", cost.TRAINING_MODELS)
def test_training_step_times_build_the_chapters_models_and_optimizers(which):
    rounds = cost.training_step_times(which, repeats=1, optimizers={
        "adam": ("adam", 1e-4, None), "md_p1.1": ("md", 1e-4, 1.1)})
    assert set(rounds) == {"adam", "md_p1.1"} and all(len(t) == 1 and t[0] > 0 for t in rounds.values())


def _positive_finite(x):
    return isinstance(x, float) and np.isfinite(x) and x > 0


def _fake(monkeypatch, module, name, result):
    """Replace ``module.name`` by a function that records its arguments (by name) and returns
    ``result(arguments)``: timings chosen by hand, so the report's numbers are known in advance."""
    signature = inspect.signature(getattr(module, name))
    calls = []

    def fake(*args, **kwargs):
        arguments = dict(signature.bind(*args, **kwargs).arguments)
        calls.append(arguments)
        return result(arguments)
    monkeypatch.setattr(module, name, fake)
    return calls


def test_ratio_entry_is_the_median_of_round_by_round_ratios_against_its_target():
    # ratios 3/2, 1/2, 4/2 -> median 1.5 (the ratio of the medians would be 3/2 too; of the means 8/6)
    entry = cost.ratio_entry([3.0, 1.0, 4.0], [2.0, 2.0, 2.0], 1.10)
    assert entry["median_ratio"] == 1.5 and entry["target"] == 1.10 and not entry["met"]
    assert entry["ci95"][0] >= 0.5 and entry["ci95"][1] <= 2.0
    speedup = cost.ratio_entry([4.0, 6.0, 1.0], [1.0, 2.0, 1.0], 2.0, key="median_speedup", at_least=True)
    assert speedup["median_speedup"] == 3.0 and speedup["met"]  # ratios 4, 3, 1


def test_optimizer_benchmark_reports_the_medians_and_ratios_of_what_it_timed(monkeypatch):
    import torch

    # every torch contender 2 ms then 4 ms; md default 1 ms then 6 ms (ratios 0.5, 1.5 -> 1.0: met, <= 1.2);
    # md fused 4 then 6 ms (ratios 2, 1.5 -> 1.75: missed, > 1.3); md foreach as slow, but without a target
    steps = _fake(monkeypatch, cost, "optimizer_step_times", lambda a: {
        **{name: [2e-3, 4e-3] for name in a["torch_contenders"]}, "md_p1.75_default": [1e-3, 6e-3],
        "md_p1.75_fused": [4e-3, 6e-3], "md_p1.75_foreach": [4e-3, 6e-3]})
    # Adam 10 then 20 ms; md_p1.1 20 and 20 ms (ratios 2, 1 -> 1.5: missed); md_p3 as Adam (1.0: met)
    training = _fake(monkeypatch, cost, "training_step_times", lambda a: {
        "adam": [0.010, 0.020], "md_p1.1": [0.020, 0.020], "md_p3": [0.010, 0.020]})
    _fake(monkeypatch, bench, "sparse_embedding_step_times", lambda a: {"dense": [0.010, 0.020],
                                                                        "sparse": [0.005, 0.020]})
    out = bench.optimizer(SimpleNamespace(repeats=2))
    json.dumps(out)  # what the CLI prints

    assert out["sparse_embedding"]["sparse / dense"]["median_ratio"] == 0.75  # ratios 0.5 and 1
    assert [c["total"] for c in steps] == list(bench.TABLE_SIZES) == [1_000_000, 10_000_000]
    assert all(c["repeats"] == 2 and c["torch_contenders"] == bench.TABLE_CONTENDERS for c in steps)
    assert {"sgd_foreach", "sgd-momentum_fused", "adam_foreach", "adamw_fused"} <= set(bench.TABLE_CONTENDERS)
    assert out["repeats"] == 2 and out["torch"] == torch.__version__ and out["threads"] == torch.get_num_threads()
    for size in ("1000000", "10000000"):
        report = out["steps"][size]
        assert report["step_ms_median"]["adamw_foreach"] == 3.0 and report["step_ms_median"]["md_p1.75_default"] == 3.5
        assert report["step_ratios"]["md_p1.75_default"] == {
            "vs": "adamw_foreach", "median_ratio": 1.0, "ci95": [0.5, 1.5], "target": 1.2, "met": True}
        assert report["step_ratios"]["md_p1.75_fused"]["vs"] == "adamw_fused"
        assert report["step_ratios"]["md_p1.75_fused"]["met"] is False
        assert report["step_ratios"]["md_p1.75_foreach"]["target"] is None  # reported, not judged
    assert "| md_p1.75_default | 3.50 | adamw_foreach | 1.00 [0.50, 1.50] | <= 1.2 (met) |" in out["table"]
    assert "| md_p1.75_fused | 5.00 | adamw_fused | 1.75 [1.50, 2.00] | <= 1.3 (missed) |" in out["table"]

    assert [c["which"] for c in training] == list(cost.TRAINING_MODELS) == list(out["training_steps"])
    assert all(c["repeats"] == 2 for c in training)
    for report in out["training_steps"].values():
        assert report["step_ms_median"] == {"adam": 15.0, "md_p1.1": 20.0, "md_p3": 15.0}
        assert set(report) == {"step_ms_median", "md_p1.1 / adam", "md_p3 / adam"}
        assert report["md_p1.1 / adam"]["median_ratio"] == 1.5 and not report["md_p1.1 / adam"]["met"]
        assert report["md_p3 / adam"] == {"median_ratio": 1.0, "ci95": [1.0, 1.0], "target": 1.10, "met": True}
    assert out["all_targets_met"] is False  # fused misses its step target, md_p1.1 its training target


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
        entry = out["speedup_vs_reference_kernels"][name]
        reference, fast = times[f"{name}_reference"], times[f"{name}_fast"]
        two_ratios = sorted([reference[0] / fast[0], reference[1] / fast[1]])
        assert two_ratios[0] - 1e-3 <= entry["median_speedup"] <= two_ratios[1] + 1e-3  # between the rounds
        assert entry["target"] == bench.KERNELS_TARGET


def test_training_benchmark_speedups_are_reference_over_fast_time(monkeypatch):
    # md_p1.1: reference 30 and 20 ms against 10 ms (speedups 3 and 2 -> 2.5, met); gd: 1.5 and 1.5 (missed)
    _fake(monkeypatch, bench, "kernel_step_times", lambda a: {
        "md_p1.1_fast": [0.010, 0.010], "md_p1.1_reference": [0.030, 0.020],
        "gd_fast": [0.020, 0.020], "gd_reference": [0.030, 0.030]})
    out = bench.training(SimpleNamespace(repeats=2))
    assert out["step_ms_median"] == {"md_p1.1_fast": 10.0, "md_p1.1_reference": 25.0, "gd_fast": 20.0,
                                     "gd_reference": 30.0}
    md, gd = out["speedup_vs_reference_kernels"]["md_p1.1"], out["speedup_vs_reference_kernels"]["gd"]
    assert md == {"median_speedup": 2.5, "ci95": [2.0, 3.0], "target": 2.0, "met": True}
    assert gd["median_speedup"] == 1.5 and not gd["met"] and out["all_targets_met"] is False


def test_store_bench_times_every_current_kinds_reads_and_their_content_check(tmp_path, monkeypatch, capsys):
    """``python -m mdlib bench store``: per kind, the entries read back whole and their sha256 check alone;
    an empty store and an entry that no longer reads back are one-line errors."""
    import pandas as pd

    from mdlib.book import cli
    from mdlib.runs import store

    monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path / "build"))
    assert cli.main(["bench", "store"]) == 1
    assert "no stored runs from today's code" in capsys.readouterr().err
    for a in (1, 2):
        store.load_or_run(RunId.of("c", {"a": a}), lambda: {"t": pd.DataFrame({"x": np.arange(1000.0)}), "y": np.arange(1e5)})
    report = bench.store_reads(SimpleNamespace(repeats=3))
    row = report["kinds"]["c"]
    assert report["benchmark"] == "store" and set(report["kinds"]) == {"c"} and row["entries"] == 2
    assert row["read_ms"] > 0 and row["check_ms"] > 0 and row["check_share"] > 0
    entry = next((tmp_path / "build" / "runs" / "c").iterdir())
    (entry / "t.parquet").write_bytes((entry / "t.parquet").read_bytes() + b" ")
    with pytest.raises(ValueError, match="a c entry does not read back"):
        bench.store_reads(SimpleNamespace(repeats=1))


def test_chapter_08s_step_tables_hold_the_medians_and_ratios_of_what_was_timed(monkeypatch):
    rounds = {"adam_fused": [1e-3, 2e-3, 4e-3], "sgd_fused": [1e-3, 1e-3, 1e-3], "md_p3_fused": [1e-3, 3e-3, 4e-3]}
    calls = _fake(monkeypatch, cost, "optimizer_step_times", lambda arguments: rounds)
    steps, targets = cost.step_tables([1000, 2000], [2.0, 3.0], repeats=3, modes=("fused",))
    assert [c["ps"] for c in calls] == [[3.0], [3.0]] and calls[0]["modes"] == ("fused",)  # p = 2 is SGD
    md = steps[(steps.optimizer == "md_p3_fused") & (steps.params == 2000)].iloc[0]
    assert md.ms == pytest.approx(3.0) and md.ns_per_param == pytest.approx(3e-3 / 2000 * 1e9)
    assert md.vs_adam_fused == pytest.approx(1.0)  # round by round: 1, 1.5, 1
    assert list(targets.optimizer) == ["md_p3_fused"] * 2 and list(targets.median_ratio) == [1.0, 1.0]
    assert list(targets.reference) == ["adam_fused"] * 2 and list(targets.target) == [1.10] * 2


def test_chapter_08s_ops_table_names_every_optimizer_through_methods():
    steps = pd.DataFrame([{"params": n, "optimizer": name, "ns_per_param": n / 1000 + i}
                          for n in (10, 100) for i, name in enumerate(
                              ["sgd_default", "sgd_fused", "adam_default", "adam_foreach", "adam_fused",
                               "md_p1.1_default", "md_p3_default"])])
    table = cost.ops_table(steps, [1.1, 2.0, 3.0], modes=("default",))
    assert list(table.optimizer) == ["SGD (default)", "SGD (fused)", "Adam (default)", "Adam (foreach)",
                                     "Adam (fused)", "ℓ1.1 (default)", "ℓ3 (default)"]
    assert list(table["paper ops per param"]) == [2, 2, 14, 14, 14, 10, 10]
    assert list(table["ns per param (step, largest size)"]) == pytest.approx([0.1 + i for i in range(7)])


def test_chapter_08s_training_table_is_each_optimizer_against_adam_round_by_round(monkeypatch):
    times = {"adam": [1.0, 2.0, 4.0], "md_p1.1": [1.0, 3.0, 4.0]}
    _fake(monkeypatch, cost, "training_step_times", lambda arguments: times)
    monkeypatch.setattr(cost, "TRAINING_OPTIMIZERS", {"adam": ("adam", 1e-4, None), "md_p1.1": ("md", 1e-4, 1.1)})
    table = cost.training_table(repeats=3)
    assert list(table.columns) == ["model", "optimizer", "ms per step", "vs Adam (median ratio)", "ci95", "method",
                                   "ci_low", "ci_high"]
    assert list(table.model) == ["sentiment encoder (04)"] * 2 + ["ViT (07)"] * 2
    assert list(table.optimizer) == ["Adam", "ℓ1.1"] * 2 and list(table.method) == ["adam", "1.1"] * 2
    md = table.iloc[1]
    assert md["ms per step"] == 3000 and md["vs Adam (median ratio)"] == 1.0  # ratios 1, 1.5, 1
    assert md.ci_low <= 1.0 <= md.ci_high and md.ci95 == f"{md.ci_low:.2f}-{md.ci_high:.2f}"


def test_chapter_08s_vit_table_extrapolates_the_papers_epochs():
    table = cost.vit_table("tiny", batch=4, repeats=1, ps=(1.1,))
    assert list(table.optimizer) == ["Adam", "ℓ1.1"] and table.params.nunique() == 1
    assert list(table.hours_2000_epochs) == pytest.approx(list(table.step_s * 12500 * 2000 / 3600))
    with pytest.raises(ValueError, match="'vit'"):
        cost.vit_table("huge")


def test_the_command_line_offers_exactly_the_benchmarks_there_are():
    from mdlib.book import cli

    args = cli.build_parser().parse_args(["bench", "store"])
    assert bench.BENCHMARKS[args.what] is bench.store_reads
    choices = next(a.choices for a in cli.build_parser()._subparsers._group_actions[0].choices["bench"]._actions
                   if a.dest == "what")
    assert list(choices) == list(bench.BENCHMARKS)
