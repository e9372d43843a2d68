"""The theme's fixed colours and the chapters' figures (saving them: test_artifacts.py)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from pathlib import Path  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from mdlib.book import plots


pytestmark = pytest.mark.usefixtures("build_dir")  # conftest's: what they write goes to a temporary build


def test_p_colors_are_fixed_and_distinct():
    main = [plots.p_color(p) for p in (1.1, 1.75, 2, 3)]
    assert len(set(main)) == 4
    assert plots.p_color(2) == plots.p_color(2.0) == plots.p_color("2") == plots.p_color("gd")
    import seaborn as sns

    spare = [sns.color_palette("colorblind", 10)[i] for i in plots._SPARE_SLOTS]
    other = plots.p_color(1.3)  # other values: a spare slot, the same however p is written
    assert other in spare and other not in main and other == plots.p_color("1.3") == plots.p_color(1.3000001)
    assert plots.p_color("adam") not in main
    assert plots.p_label(2) == r"$\ell_{2}$ (GD)" and plots.p_label(1.1) == r"$\ell_{1.1}$"


RESULTS = Path(__file__).parent / "fixtures" / "results"  #: a smoke build's results (fixtures/make_results.py)


def _path_frame() -> pd.DataFrame:
    """Two exponents' normalized paths over 3 steps in 3 entries; W[0,1] and W[1,1] differ most in their SVM
    value over p (spreads 0.8 and 0.5; W[0,0] has none)."""
    svm = {1.5: {"W[0,0]": 0.6, "W[0,1]": 0.1, "W[1,1]": 0.3}, 3.0: {"W[0,0]": 0.6, "W[0,1]": 0.9, "W[1,1]": -0.2}}
    return pd.DataFrame([{"p": p, "entry": e, "step": k, "value": v * k / 2, "svm": v}
                         for p, row in svm.items() for e, v in row.items() for k in range(3)])


def test_e2_path_figure_draws_the_two_most_different_entries():
    normalized = _path_frame()
    norms = pd.DataFrame([{"p": p, "step": k, "norm": 2.0 * k} for p in (1.5, 3.0) for k in range(3)])
    fig, entries = plots.e2_path_figure(normalized, norms, [1.5, 3.0])
    assert entries == ["W[0,1]", "W[1,1]"]
    left, right = fig.axes
    path, ray = left.lines[0], left.lines[1]  # p = 1.5: W(k) = direction * norm, then the SVM ray
    assert list(path.get_xdata()) == pytest.approx([0.1 * k / 2 * 2 * k for k in range(3)])
    reach = max(np.hypot(path.get_xdata(), path.get_ydata()))
    assert np.hypot(ray.get_xdata()[1], ray.get_ydata()[1]) == pytest.approx(reach)
    assert ray.get_ydata()[1] / ray.get_xdata()[1] == pytest.approx(0.3 / 0.1)  # along the own SVM direction
    assert len(right.lines) == 2 and right.get_xlabel().startswith("$W_{0,1}$")
    plt.close(fig)


def test_e2_growth_and_cost_figures_draw_a_smoke_build_s_numbers():
    curves = pd.read_csv(RESULTS / "fig-e2-norm-growth.csv")
    plain = curves[(curves.method == "plain") & (curves.step > 0)]
    ps = sorted(plain.p.unique())
    fig = plots.e2_growth_figure(plain, ps)
    assert [len(ax.lines) for ax in fig.axes] == [len(ps)] * 3
    first = plain[plain.p == ps[0]]
    assert list(fig.axes[1].lines[0].get_ydata()) == pytest.approx(list(1 - first.selected_probability))
    plt.close(fig)
    steps = pd.read_csv(RESULTS / "fig-cost-step.csv")
    fig = plots.cost_step_figure(steps)
    left, right = fig.axes
    assert len(left.lines) == len(right.lines) - 1 == steps.optimizer.nunique()  # right: the line at 1 too
    adam = steps[steps.optimizer == "adam_fused"]
    assert list(right.lines[0].get_xdata()) == list(steps[steps.optimizer == steps.optimizer.iloc[0]].params)
    assert list(adam.vs_adam_fused) == pytest.approx([1.0] * len(adam))
    plt.close(fig)


def test_e3_joint_figure_has_a_row_per_exponent():
    probabilities = pd.DataFrame([{"p": p, "step": k, "example": x, "attention_selected": 0.5 + k / 10,
                                   "classifier": 0.5} for p in (1.5, 2.0) for x in (1, 2) for k in range(5)])
    paths_ = pd.DataFrame([{"p": p, "entry": e, "step": k, "value": 0.1 * k, "svm": 0.5}
                           for p in (1.5, 2.0) for e in ("a", "b") for k in range(5)])
    fig = plots.e3_joint_figure(probabilities, paths_, paths_, [1.5, 2.0], first_steps=3)
    assert len(fig.axes) == 6
    first = fig.axes[0]
    assert len(first.lines) == 4 and max(first.lines[0].get_xdata()) == 3  # the first 3 steps only
    assert first.get_title() == "first 3 steps"
    plt.close(fig)


def test_step_size_figure_marks_the_choice_the_diverged_runs_and_the_references():
    """Chapter 09's figure: a line per p of its finished steps (mean over seeds), a circle on the chosen
    step, an x for a step that diverged at any seed, AdamW's and SGD's chosen runs as horizontal lines."""
    rows = []
    for p, chosen in ((1.1, 1.0), (3.0, 0.1)):
        for multiple in (0.1, 1.0, 10.0):
            for seed in (0, 1):
                diverged = p == 1.1 and multiple == 10.0 and seed == 1
                rows.append({"method": f"{p:g}", "optimizer": "md", "p": p, "multiple": multiple, "lr": multiple * p,
                             "sgd_equivalent_lr": multiple, "seed": seed, "diverged": diverged,
                             "validation_loss": np.nan if diverged else 0.5 + multiple / 100 + seed / 10,
                             "validation_accuracy": np.nan if diverged else 0.7, "chosen": multiple == chosen})
    for method, loss in (("adamw", 0.6), ("sgd", 0.55)):
        rows.append({"method": method, "optimizer": method, "p": np.nan, "multiple": 1.0, "lr": 1e-3,
                     "sgd_equivalent_lr": np.nan, "seed": 0, "diverged": False, "validation_loss": loss,
                     "validation_accuracy": 0.7, "chosen": True})
    fig = plots.step_size_figure(pd.DataFrame(rows))
    top_left, top_right = fig.axes[0], fig.axes[1]
    assert len(fig.axes) == 4
    line, circle, crosses = top_left.lines[:3]  # p = 1.1: its finished steps, the chosen one, the diverged one
    assert list(line.get_xdata()) == pytest.approx([0.11, 1.1]) and list(circle.get_xdata()) == pytest.approx([1.1])
    assert list(line.get_ydata()) == pytest.approx([0.551, 0.56])  # means over the two seeds
    assert list(crosses.get_xdata()) == pytest.approx([11.0])
    assert list(top_right.lines[0].get_xdata()) == pytest.approx([0.1, 1.0])  # the SGD-equivalent steps
    flat = [line for line in top_left.lines if list(line.get_ydata()) in ([0.6, 0.6], [0.55, 0.55])]
    assert len(flat) == 2  # AdamW and SGD
    plt.close(fig)


def test_dataset_and_method_names_have_one_source():
    from mdlib.experiments import methods

    assert [methods.dataset_text(d) for d in ("fashion_mnist", "cifar10", "cifar100")] == [
        "Fashion-MNIST", "CIFAR-10", "CIFAR-100"]
    assert methods.dataset_text("rotten_tomatoes") == "rotten_tomatoes"  # no display name: the key itself
    from mdlib.experiments import vision

    assert set(methods.DATASET_NAMES) == set(vision.DATASETS)


def test_training_curves_draw_one_column_per_depth_with_the_stop_rule():
    curves = pd.read_csv(RESULTS / "fig-sentiment-curves.csv").astype({"method": str})
    keys = list(dict.fromkeys(curves.method))
    fig = plots.training_curves(curves, keys)
    top, bottom = fig.axes
    assert top.get_title() == "3 layers, 3 heads" and top.get_ylabel() == "accuracy (%)"
    seeds = curves.groupby("method").seed.nunique()
    # per method: the test accuracy, the training accuracy (dotted) and a tick per seed; then the stop rule
    assert len(top.lines) == sum(2 + seeds[k] for k in keys) + 1 and len(bottom.lines) == len(keys)
    assert top.lines[-1].get_ydata()[0] == pytest.approx(100 * 0.995)
    plt.close(fig)


def test_training_curves_draw_one_column_per_data_set_at_the_evaluated_epochs():
    history = pd.DataFrame([{"dataset": d, "method": m, "seed": s, "epoch": e, "train_loss": 1 / e + s,
                             "train_accuracy": 0.5, "test_accuracy": 0.1 * e + 0.01 * s if e % 2 == 0 else np.nan}
                            for d in ("fashion_mnist", "cifar10") for m in ("adam", "1.1") for s in (0, 1)
                            for e in range(1, 7)])
    fig = plots.training_curves(history, ["adam", "1.1"], stop=None, by="dataset",
                                titles={"fashion_mnist": "Fashion-MNIST", "cifar10": "CIFAR-10"},
                                reference={"cifar10": 82.0}, reference_label="paper (2000 epochs)")
    (fashion, cifar), (fashion_loss, _) = fig.axes[:2], fig.axes[2:]
    assert [fashion.get_title(), cifar.get_title()] == ["Fashion-MNIST", "CIFAR-10"]
    assert len(fashion.lines) == 2 and len(cifar.lines) == 3  # no training accuracy; the paper's line on CIFAR
    assert fashion.get_ylabel() == "test accuracy (%)"
    adam = fashion.lines[0]
    assert list(adam.get_xdata()) == [2, 4, 6] and list(adam.get_ydata()) == pytest.approx([20.5, 40.5, 60.5])
    assert list(fashion_loss.lines[0].get_xdata()) == list(range(1, 7))
    assert "paper (2000 epochs)" in [t.get_text() for t in cifar.get_legend().get_texts()]
    plt.close(fig)


def test_pruning_curves_draw_one_panel_or_one_per_data_set():
    pruning = pd.DataFrame([{"dataset": d, "method": m, "seed": s, "sparsity": x, "test_accuracy": 0.9 - x / 2 - s / 10}
                            for d in ("cifar10", "cifar100") for m in ("adam", "1.1") for s in (0, 1)
                            for x in (0.0, 0.5, 0.9)])
    fig = plots.pruning_curves(pruning[pruning.dataset == "cifar10"], ["adam", "1.1"])
    ax, = fig.axes
    assert ax.lines[-1].get_ydata()[0] == 50  # chance
    plt.close(fig)
    fig = plots.pruning_curves(pruning, ["adam", "1.1"], chance=None, by="dataset",
                               titles={"cifar10": "CIFAR-10", "cifar100": "CIFAR-100"})
    assert [ax.get_title() for ax in fig.axes] == ["CIFAR-10", "CIFAR-100"]
    first = fig.axes[0].containers[0]  # adam's error bars: the mean over seeds
    assert list(first.lines[0].get_ydata()) == pytest.approx([85.0, 60.0, 40.0])
    assert all(len(ax.containers) == 2 for ax in fig.axes)  # no chance line
    plt.close(fig)


def test_weight_histograms_draw_a_row_per_entry_and_a_column_per_kind():
    import torch

    weights = {"key": [torch.arange(16.0).view(4, 4) / 40], "query": [torch.full((4, 4), 0.2)],
               "value": [torch.full((2, 2), -0.3)]}
    fig = plots.weight_histograms({"CIFAR-10": {("Adam", "black"): weights},
                                   "CIFAR-100": {("Adam", "black"): weights, ("init", "grey"): weights}}, 0.15)
    assert len(fig.axes) == 6
    assert [ax.get_title() for ax in fig.axes[:3]] == ["CIFAR-10: key weights", "CIFAR-10: query weights",
                                                       "CIFAR-10: value weights"]
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["Adam (9)"]  # 7/40 ... 15/40
    assert [t.get_text() for t in fig.axes[5].get_legend().get_texts()] == ["Adam (4)", "init (4)"]  # |w|
    shared = fig.axes[0].get_shared_y_axes()
    assert shared.joined(fig.axes[0], fig.axes[2]) and not shared.joined(fig.axes[0], fig.axes[3])  # one per row
    plt.close(fig)


def test_e1_figures_draw_a_panel_per_exponent_pair_and_per_training_exponent():
    curves = pd.read_csv(RESULTS / "fig-e1-paths.csv")
    train_ps, svm_ps = sorted(curves.train_p.unique()), sorted(curves.svm_p.unique())
    fig = plots.e1_paths_figure(curves, svm_ps)
    assert len(fig.axes) == len(train_ps) * len(svm_ps) and fig.axes[0].get_title() == f"SVM {plots.p_label(svm_ps[0])}"
    last = curves[(curves.train_p == train_ps[-1]) & (curves.svm_p == svm_ps[-1])]
    assert list(fig.axes[-1].lines[0].get_ydata()) == pytest.approx(list(last["mean"]))
    plt.close(fig)
    stall = pd.concat([curves[(curves.train_p == p) & (curves.svm_p == p)].assign(method=name)
                       for p in train_ps for name in ("exact", "naive")])
    fig = plots.e1_stall_figure(stall)
    assert len(fig.axes) == len(train_ps) and [line.get_linestyle() for line in fig.axes[0].lines] == ["-", "--"]
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["exact", "naive"]
    plt.close(fig)


def test_magnitude_histogram_is_log_scaled_only_when_something_is_counted():
    import warnings

    fig, (empty, full) = plt.subplots(1, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "Data has no positive values" from a log axis of empty histograms
        plots.magnitude_histogram(empty, {("l1.1", "C0"): np.array([0.01, 0.02])}, threshold=0.06)
        plots.magnitude_histogram(full, {("l1.1", "C0"): np.array([0.01, 0.07, 0.08])}, threshold=0.06)
    assert empty.get_yscale() == "linear" and full.get_yscale() == "log"
    assert empty.get_legend_handles_labels()[1] == ["l1.1 (0)"] and full.get_legend_handles_labels()[1] == ["l1.1 (2)"]
    plt.close(fig)
