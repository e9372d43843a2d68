# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Sentiment classification: Table 1 (E4)
#
# **The claim.** On the Stanford IMDb reviews, a small transformer encoder trained by $\ell_{1.1}$
# mirror descent reaches a higher test accuracy than the same model trained by gradient descent
# ($\ell_2$) or by $\ell_3$ mirror descent, for 3, 4 and 6 layers (heads = layers). The paper's
# Table 1 reports, as best test accuracy over epochs averaged over runs, {cite}`julistiono2026mirror`
#
# | layers | $\ell_{1.1}$ | $\ell_2$ (GD) | $\ell_3$ |
# |---|---|---|---|
# | 3 | 83.47 | 81.66 | 82.57 |
# | 4 | 83.36 | 81.05 | 82.40 |
# | 6 | 83.65 | 82.23 | 81.98 |
#
# with standard deviations of 0.1-0.2 points: $\ell_{1.1}$ beats GD by 1.81, 2.31 and 1.43 points.
# Every run trains until its training accuracy reaches 99.5 %; in the authors' runs that took on
# average 72 / 87 / 150 epochs for $\ell_{1.1}$, 80 / 88 / 58 for GD and 162 / 135 / 95 for $\ell_3$
# (3 / 4 / 6 layers, 250 steps an epoch). (These are the outputs of the authors' code, whose ten runs
# of a cell shared one initialization; its re-run notebook reports 82.57 / 81.03 / 80.65 at 6 layers.)
#
# **What we run: the authors' setup.** The model and the training rule as the authors' public code
# runs them (the spec's section 5a): token and position embeddings drawn $N(0, 1)$, torch's default
# uniform initialization of every matrix (bound $1/\sqrt{\text{fan in}}$), post-LN blocks without
# biases, dropout 0.2 on the attention probabilities and on both residual branches, a classifier
# without bias on the [CLS] token; binary cross-entropy **summed** over the batch of 100 (the
# paper's step sizes assume the sum); plain mirror descent {eq}`eq-md-update` on every parameter;
# training stops after the first epoch whose running training accuracy (dropout on) reaches 99.5 %.
# Mirror descent is not scale-invariant (by {eq}`eq-md-update`, an entry $w$ moves by about
# $\eta\, g\, |w|^{2-p}/(p-1)$), so these choices
# decide which layers move and how fast: they are part of the replication. Three things differ, and
# we state them: distinct initializations per seed; step sizes chosen per method among multiples
# of the paper's, by the validation accuracy at the stop rule (never by test); and training batches
# of similar lengths (the same random examples per epoch, less padding). The default profile runs
# offline on a seeded subset of the Rotten Tomatoes sentences (the spec's section 6; test and
# validation splits of 1,057 and 1,056 sentences) with a narrower model, sized so that every run
# reaches the stop rule on two CPU cores; the `paper` profile runs IMDb at the paper's scale and step
# sizes. Last, an ablation the paper does not have: the same comparison from the initialization
# this project used before (`setup="modern"`), to ask whether the result depends on it.

# %% tags=["parameters"]
profile = "default"  # the params/ profile that produced this page (set by the pipeline)
dataset = "rotten_tomatoes"  # "rotten_tomatoes" (offline) or "imdb" (internet)
max_length = 64  # WordPiece tokens per text, [CLS] and [SEP] included (covers 99.9 % of the sentences)
train_size = 1000  # training sentences (a seeded, stratified subset; None: the whole training split)
width = 24  # model width (paper: 384); the MLP is 4 x width
layers = [3]  # numbers of layers (and heads) of the rows of Table 1 (paper: [3, 4, 6])
methods = ["1.1", "2", "3"]  # l_p exponents of mirror descent ("2" is GD); "adam" adds Adam as an extra column
seeds = 5  # runs per cell, seeds 0..seeds-1: distinct initializations, data orders and dropout
epochs = 600  # most epochs per run; a run stops at 99.5 % training accuracy
setup = "authors"  # initialization: "authors" (the replication) or "modern"
step_multiples = {"1.1": [1, 3], "2": [3, 10], "3": [300]}  # candidate step sizes, as multiples of the paper's (Adam: of 1e-3)
ablation_setup = "modern"  # the ablation's initialization ("" for no ablation)
ablation_methods = ["1.1", "2"]  # methods of the ablation (at the first depth of layers)
ablation_seeds = 3  # seeds of the ablation
ablation_multiples = {"1.1": [1, 3], "2": [3]}  # the ablation's candidate step multiples (l1.1 at 3x overflowed from the modern init)
workers = 2  # runs trained at once, one CPU thread each (use 1 on a GPU)

# %% tags=["remove-stderr"]
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator
from myst_nb import glue

from mdlib import analysis, optim, plots, sentiment

plots.set_theme()
config = dict(dataset=dataset, max_length=max_length, train_size=train_size, width=width, setup=setup,
              epochs=epochs, layers=layers, methods=methods, seeds=seeds, multiples=step_multiples)
grid = sentiment.grid(config, workers=workers, name=sentiment.grid_name(profile))  # chapters 05 and 06 read it
print(f"profile={profile}: {dataset} ({train_size or 'all'} training texts), width {width}, layers {layers}, "
      f"{seeds} seeds, <= {epochs} epochs, setup {setup!r}")
label = {key: plots.method_label(*optim.method(key)) for key in methods}
text = {key: plots.method_text(*optim.method(key)) for key in methods}

# %% [markdown]
# ## Step sizes
#
# For every depth and method, seed 0 trains at each candidate step size (a multiple of the paper's).
# The candidate chosen is the one that reached the stop rule with the best validation accuracy at
# the end (ties: the smaller step); the test split plays no part. The other seeds then train at the
# chosen step. Saved as `_build/results/table-sentiment-steps.csv`.

# %% tags=["hide-input"]
steps = grid.runs[grid.runs.seed == 0]
shown = pd.DataFrame({
    "layers": steps.layers, "method": [label[k] for k in steps.method], "× paper": [f"{m:g}" for m in steps.multiple],
    "lr": [f"{lr:.3g}" for lr in steps.lr],
    "epochs": ["diverged" if d else f"{e:.0f}" for d, e in zip(steps.diverged, steps.epochs)],
    "training acc.": [f"{a:.1%}" if a == a else "–" for a in steps.train_accuracy],
    "validation acc.": [f"{a:.1%}" if a == a else "–" for a in steps.validation],
    "chosen": ["✓" if c else "" for c in steps.chosen]})
plots.save_table(steps, "table-sentiment-steps", styled=shown.style.hide(axis="index"))

# %% [markdown]
# ```{glue:figure} table-sentiment-steps
# :name: table-sentiment-steps
#
# The step-size choice (seed 0): epochs to the stop rule (or the cap), the training accuracy of the
# last epoch, the validation accuracy at the end, and the chosen multiple.
# ```
#
# ## Table 1

# %% tags=["hide-input"]
paper, paper_epochs = sentiment.PAPER_TABLE_1, sentiment.PAPER_EPOCHS_TO_STOP
chosen_runs = grid.runs[grid.runs.chosen]
cells = chosen_runs.groupby(["layers", "method"], sort=False).agg(
    mean=("best_test", "mean"), std=("best_test", "std"), last=("last_test", "mean"), epochs=("epochs", "mean"),
    reached=("reached", "sum"), runs=("seed", "count"), multiple=("multiple", "first")).reset_index()
rows = []
for L in layers:
    row = {"layers": L}
    for key in methods:
        cell = cells[(cells.layers == L) & (cells.method == key)].iloc[0]
        name = label[key] + (" [extra]" if key == "adam" else "")
        row[name] = f"{100 * cell['mean']:.2f} ± {100 * cell['std']:.2f}"
        row[f"{name} epochs"] = f"{cell['epochs']:.0f} ({cell['reached']}/{cell['runs']})"
        glue(f"t1-{L}-{key}", float(100 * cell["mean"]), display=False)
    for key in ("1.1", "2", "3"):
        row[f"paper {label[key]}"] = (f"{paper[L][key]:.2f} ({paper_epochs[L][key]} ep.)" if L in paper else "–")
    rows.append(row)
table1 = pd.DataFrame(rows)
plots.save_table(cells.assign(paper=[paper.get(L, {}).get(k, np.nan) for L, k in zip(cells.layers, cells.method)],
                              paper_epochs=[paper_epochs.get(L, {}).get(k, np.nan) for L, k in zip(cells.layers, cells.method)]),
                 "table-1", styled=table1.style.hide(axis="index"))

reached, total = int(chosen_runs.reached.sum()), len(chosen_runs)
glue("t1-reached", f"{reached} of {total}", display=False)
glue("t1-epochs", "; ".join(f"{text[k]} {cells[(cells.layers == L) & (cells.method == k)].epochs.iloc[0]:.0f}"
                            for L in layers for k in methods), display=False)
glue("t1-data", f"{dataset}, {train_size or 'all'} training texts, width {width}, {seeds} seeds, "
                f"at most {epochs} epochs", display=False)
mean = cells.set_index(["layers", "method"])["mean"]
lp_keys = [k for k in methods if k != "adam"]
glue("t1-best", "; ".join(f"{text[max(lp_keys, key=lambda k: mean[L, k])]} at {L} layers" for L in layers),
     display=False)
gaps = []
for L in layers:
    if {"1.1", "2"} <= set(methods):
        by = lambda k: chosen_runs[(chosen_runs.layers == L) & (chosen_runs.method == k)].best_test  # noqa: E731
        d, low, high = analysis.difference_interval(100 * by("1.1"), 100 * by("2"))
        gaps.append(f"{d:+.2f} [{low:+.2f}, {high:+.2f}] at {L} layers" if low == low else f"{d:+.2f} at {L} layers")
glue("t1-gaps", "; ".join(gaps) or "not measured", display=False)

# %% [markdown]
# ```{glue:figure} table-1
# :name: table-1
#
# The paper's Table 1 reproduced: best test accuracy over epochs (%), mean ± standard deviation over seeds, with the mean
# number of epochs to the stop rule (and how many runs reached it), next to the paper's IMDb numbers
# and the authors' epochs to the stop. Per cell (also the last epoch's accuracy):
# `_build/results/table-1.csv`; per run: `_build/results/table-sentiment-runs.csv`.
# ```

# %% tags=["hide-input"]
plots.save_table(grid.runs, "table-sentiment-runs", glue=False)


def plot_curves(ax, history, keys):
    """Test accuracy (mean, band: one std over seeds, while every seed still runs) and training
    accuracy (dotted, mean) per method."""
    for key in keys:
        runs_ = history[history.method == key]
        alive = runs_.groupby("epoch")["seed"].count() == runs_.seed.nunique()
        curve = runs_.groupby("epoch")["test_accuracy"].agg(["mean", "std"])[alive].reset_index()
        train_curve = runs_.groupby("epoch")["train_accuracy"].mean()[alive]
        color = plots.method_color(*optim.method(key))
        ax.plot(curve.epoch, 100 * curve["mean"], color=color, label=label.get(key, key))
        ax.fill_between(curve.epoch, 100 * (curve["mean"] - curve["std"].fillna(0)),
                        100 * (curve["mean"] + curve["std"].fillna(0)), color=color, alpha=0.2, linewidth=0)
        ax.plot(train_curve.index, 100 * train_curve.values, color=color, linestyle=":", linewidth=1.2)
        for _, run in runs_.groupby("seed"):  # where each run stopped
            ax.plot(run.epoch.iloc[-1], 100 * run.train_accuracy.iloc[-1], marker="|", color=color, markersize=9)
    ax.axhline(99.5, color="0.5", linestyle=":", linewidth=1)
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


fig, axes = plt.subplots(1, len(layers), figsize=(5.6 * len(layers), 3.9), sharey=True, squeeze=False)
for ax, L in zip(axes[0], layers):
    plot_curves(ax, grid.history[grid.history.layers == L], methods)
    ax.set_title(f"{L} layers, {L} heads")
axes[0, 0].set_ylabel("accuracy (%)")
axes[0, -1].legend(loc="center right", fontsize="small")
fig.tight_layout()
plots.save_figure(fig, "fig-sentiment-curves", data=grid.history)

# %% [markdown]
# ```{glue:figure} fig-sentiment-curves
# :name: fig-sentiment-curves
#
# Test accuracy against epoch (solid: mean over seeds while all of them run, band: ± one standard
# deviation) and training accuracy (dotted, mean; ticks: where each run stopped; grey line: the
# 99.5 % stop rule), per method and depth. Every run and epoch: `_build/results/fig-sentiment-curves.csv`.
# ```

# %% [markdown]
# ## Ablation: does the result depend on the initialization?
#
# The paper does not state an initialization; its code uses torch's defaults, under which the
# embeddings are large ($N(0, 1)$) and mirror descent with $p$ near 1 moves them much faster than
# GD. The same comparison from the initialization this project used before (embeddings
# $N(0, 0.02^2)$ as in BERT, Glorot-normal matrices, a classifier bias, dropout on the embeddings
# instead of the attention probabilities), at the first depth, with its own choice of step size.

# %% tags=["hide-input", "remove-stderr"]
if ablation_setup:
    ablation = sentiment.grid(dict(config, layers=layers[:1], methods=ablation_methods, seeds=ablation_seeds,
                                   multiples=ablation_multiples, setup=ablation_setup), workers=workers)
    both = pd.concat([grid.runs[grid.runs.chosen & (grid.runs.layers == layers[0])
                                & grid.runs.method.isin(ablation_methods)].assign(setup=setup),
                      ablation.runs[ablation.runs.chosen].assign(setup=ablation_setup)], ignore_index=True)
    summary = both.groupby(["setup", "method"], sort=False).agg(
        mean=("best_test", "mean"), std=("best_test", "std"), epochs=("epochs", "mean"), reached=("reached", "sum"),
        runs=("seed", "count"), multiple=("multiple", "first")).reset_index()
    shown = pd.DataFrame({"initialization": summary.setup, "method": [label[k] for k in summary.method],
                          "× paper step": [f"{m:g}" for m in summary.multiple],
                          "best test acc. (%)": [f"{100 * m:.2f}" + (f" ± {100 * s:.2f}" if s == s else "")
                                                 for m, s in zip(summary["mean"], summary["std"])],
                          "epochs (reached)": [f"{e:.0f} ({r}/{n})" for e, r, n in zip(summary.epochs, summary.reached, summary.runs)]})
    plots.save_table(both, "table-sentiment-ablation", styled=shown.style.hide(axis="index"))
    gap = {}
    for name in (setup, ablation_setup):
        rows_ = both[both.setup == name]
        gap[name] = analysis.difference_interval(100 * rows_[rows_.method == "1.1"].best_test,
                                                 100 * rows_[rows_.method == "2"].best_test)
    glue("ablation-summary", "; ".join(
        f"{name}: " + ", ".join(f"{text[r.method]} {100 * r['mean']:.2f} % in {r.epochs:.0f} epochs"
                                for _, r in summary[summary.setup == name].iterrows())
        for name in (setup, ablation_setup)), display=False)
    glue("ablation-gaps", "; ".join(f"{d:+.2f} points [{low:+.2f}, {high:+.2f}] from the {name} initialization"
                                    for name, (d, low, high) in gap.items()).replace("authors ", "authors' "),
         display=False)
else:
    plots.save_table(pd.DataFrame({"note": ["no ablation at this profile"]}), "table-sentiment-ablation")
    glue("ablation-gaps", "not measured at this profile", display=False)
    glue("ablation-summary", "not measured at this profile", display=False)

# %% [markdown]
# ```{glue:figure} table-sentiment-ablation
# :name: table-sentiment-ablation
#
# The authors' initialization against the earlier one: best test accuracy (mean ± std over seeds),
# epochs to the stop rule and how many runs reached it. Per run: `_build/results/table-sentiment-ablation.csv`.
# ```
#
# Mean best test accuracy and epochs to the stop rule, per initialization: {glue:text}`ablation-summary`.
# $\ell_{1.1}$ minus GD (best test accuracy, with a 95 % Welch interval over seeds): {glue:text}`ablation-gaps`.
#
# ## What we got, next to the paper
#
# This page was computed on {glue:text}`t1-data`. {glue:text}`t1-reached` Table 1 runs reached the
# stop rule; mean epochs to it: {glue:text}`t1-epochs` (the authors, 3 layers on IMDb: 72 / 80 / 162
# for $\ell_{1.1}$ / GD / $\ell_3$). Among the $\ell_p$ methods the best mean in each row is
# {glue:text}`t1-best`; $\ell_{1.1}$ minus GD, in points with a 95 % Welch interval over seeds:
# {glue:text}`t1-gaps` (the paper: +1.81 / +2.31 / +1.43 at 3 / 4 / 6 layers).
#
# **What this shows.** The comparison in the regime the claim is about, as far as the runs reached
# it: the authors' model, initialization, loss and step sizes (up to the chosen multiple), every run
# trained until 99.5 % training accuracy or the epoch cap (the count above says how many reached
# the rule; a run that did not is outside the claim's regime). **What it does not show.** At the
# default profile the training set is a thousand short sentences and the model is narrow, so the
# models memorize their training set and generalize weakly (compare Table 1's test accuracies with
# the paper's 83 % on 25,000 long IMDb reviews), and a few seeds resolve differences only as
# finely as the interval above. A difference in test accuracy here is not evidence for or against
# the paper's ranking; the `paper`
# profile (IMDb, width 384, 3 / 4 / 6 layers, 10 seeds, a GPU) is the test of the claim. Nor is
# "best test accuracy over epochs", the paper's metric, an unbiased estimate: it selects the epoch on
# the test set. We report it to be comparable, with the last epoch's accuracy in `table-1.csv`.
