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
# (These are the outputs of the authors' code, which reused one initialization for all ten runs of
# a cell.) The model: token and learned position embeddings, post-LN blocks without biases, GELU MLP
# of four times the width, dropout 0.2, padding masked, a linear classifier on the [CLS] token; batch
# 100, binary cross-entropy, training until the training accuracy reaches 99.5 %.
#
# **What we run.** The same model and training rule, with three changes that we state rather than
# hide: distinct initializations per seed; step sizes chosen per method by a sweep on a validation
# split (never on test), unless the profile asks for the paper's; and Adam as an extra, clearly marked
# column, the optimizer practitioners would use. The default profile runs offline on the Rotten
# Tomatoes sentences (section 6 of the spec; 8,455 / 1,056 / 1,057 stratified train / validation /
# test sentences, see `data/README.md`) at a CPU-sized scale given below; the `paper` profile runs
# IMDb with the paper's architecture and step sizes.

# %% tags=["parameters"]
profile = "default"  # the params/ profile that produced this page (set by the pipeline)
dataset = "rotten_tomatoes"  # "rotten_tomatoes" (offline) or "imdb" (internet)
max_length = 64  # WordPiece tokens per text, [CLS] and [SEP] included (covers 99.5 % of the sentences)
width = 48  # model width (paper: 384); the MLP is 4 x width
layers = [3, 4, 6]  # numbers of layers (and heads) of the rows of Table 1
methods = ["1.1", "2", "3", "adam"]  # l_p exponents of mirror descent ("2" is GD), and "adam" (extra)
seeds = 3  # runs per cell, seeds 0..seeds-1: distinct initializations, data orders and dropout
epochs = 8  # most epochs per run (training also stops at 99.5 % training accuracy)
step_sizes = "sweep"  # "sweep": every method's step size from the validation sweep; "paper": the paper's table for l_p
sweep_lrs = {"1.1": [0.03, 0.1, 0.3], "2": [0.03, 0.1, 0.3], "3": [0.001, 0.003, 0.01], "adam": [0.0003, 0.001, 0.003]}  # candidates
sweep_layers = 3  # layers of the sweep's model (one seed, the same epochs, evaluated on validation)
long_epochs = 24  # the longer comparison: most epochs of l_1.1 and GD at sweep_layers layers
long_seeds = 2  # seeds of the longer comparison
workers = 2  # runs trained at once, one CPU thread each (use 1 on a GPU)

# %% tags=["remove-stderr"]
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator
from myst_nb import glue

from mdlib import plots, sentiment

plots.set_theme()
settings = dict(dataset=dataset, max_length=max_length, width=width, epochs=epochs)
sweep_table, chosen = sentiment.sweep(sweep_lrs, workers=workers, layers=sweep_layers, **settings)
lrs = sentiment.table_step_sizes(layers, methods, chosen, step_sizes)
configs, results, history = sentiment.grid(lrs, seeds, workers=workers, **settings)
print(f"profile={profile}: {dataset}, width {width}, layers {layers}, {seeds} seeds, <= {epochs} epochs, "
      f"step sizes ({step_sizes}): {lrs}")

# %% [markdown]
# ## Step sizes
#
# Each method's step size is the candidate with the best validation accuracy (over the epochs) of a
# single run of the smallest model; the test split plays no part. The same step size then serves
# every depth. The sweep's table is saved as `_build/results/table-sentiment-sweep.csv`.

# %% tags=["hide-input"]
shown = sweep_table.assign(method=[plots.method_label(*sentiment.method(k)) for k in sweep_table.method],
                           chosen=[lr == chosen[k] for k, lr in zip(sweep_table.method, sweep_table.lr)])
plots.save_table(sweep_table.assign(chosen=shown.chosen), "table-sentiment-sweep", styled=shown.style.format(
    {"lr": "{:g}", "best_validation": "{:.2%}", "last_validation": "{:.2%}"}).hide(axis="index"))

# %% [markdown]
# ```{glue:figure} table-sentiment-sweep
# :name: table-sentiment-sweep
#
# The validation sweep: best and last validation accuracy of each candidate step size, and the
# chosen one (`chosen`).
# ```
#
# ## Table 1

# %% tags=["hide-input"]
final = history.groupby(["layers", "method", "seed"], sort=False).agg(
    best_test=("test_accuracy", "max"), last_test=("test_accuracy", "last"), epochs=("epoch", "max"),
    train=("train_accuracy", "last")).reset_index()
cells = final.groupby(["layers", "method"], sort=False).agg(
    mean=("best_test", "mean"), std=("best_test", "std"), last=("last_test", "mean"), epochs=("epochs", "mean"),
    train=("train", "mean"), runs=("seed", "count")).reset_index()
paper = sentiment.PAPER_TABLE_1
rows = []
for L in layers:
    row = {"layers": L}
    for key in methods:
        cell = cells[(cells.layers == L) & (cells.method == key)].iloc[0]
        name = plots.method_label(*sentiment.method(key)) + (" [extra]" if key == "adam" else "")
        row[name] = f"{100 * cell['mean']:.2f} ± {100 * cell['std']:.2f}"
        glue(f"t1-{L}-{key}", float(100 * cell["mean"]), display=False)
    for key in ("1.1", "2", "3"):
        row[f"paper {plots.method_label(*sentiment.method(key))}"] = f"{paper[L][key]:.2f}" if L in paper else "–"
    rows.append(row)
table1 = pd.DataFrame(rows)
plots.save_table(cells.assign(paper=[paper.get(L, {}).get(k, np.nan) for L, k in zip(cells.layers, cells.method)]),
                 "table-1", styled=table1.style.hide(axis="index"))

mean = cells.set_index(["layers", "method"])["mean"]
md_keys = [k for k in methods if k != "adam"]
best = {L: max(md_keys, key=lambda k: mean[L, k]) for L in layers}
glue("t1-best", "; ".join(f"{plots.method_text(*sentiment.method(best[L]))} at {L} layers" for L in layers),
     display=False)
gaps = " / ".join(f"{100 * (mean[L, '1.1'] - mean[L, '2']):+.2f}" for L in layers) if {"1.1", "2"} <= set(methods) else "n/a"
glue("t1-gaps", gaps, display=False)
glue("t1-layers", " / ".join(map(str, layers)), display=False)
glue("t1-data", f"{dataset}, width {width}, {seeds} seeds, at most {epochs} epochs", display=False)
glue("t1-adam", " / ".join(f"{100 * mean[L, 'adam']:.2f}" for L in layers) if "adam" in methods else "n/a",
     display=False)

# %% [markdown]
# ```{glue:figure} table-1
# :name: table-1
#
# Table 1: best test accuracy over epochs (%), mean ± standard deviation over seeds, next to the
# paper's IMDb numbers. Adam is an extra column, not in the paper. Per-cell numbers (also the last
# epoch's accuracy and the epochs run): `_build/results/table-1.csv`.
# ```

# %% tags=["hide-input"]
def plot_curves(ax, history, keys):
    """Test accuracy (mean, band: one std over seeds) and training accuracy (dotted) per method."""
    for key in keys:
        runs_ = history[history.method == key]
        curve = runs_.groupby("epoch")["test_accuracy"].agg(["mean", "std"]).reset_index()
        train_curve = runs_.groupby("epoch")["train_accuracy"].mean()
        color = plots.method_color(*sentiment.method(key))
        ax.plot(curve.epoch, 100 * curve["mean"], color=color, label=plots.method_label(*sentiment.method(key)))
        ax.fill_between(curve.epoch, 100 * (curve["mean"] - curve["std"].fillna(0)),
                        100 * (curve["mean"] + curve["std"].fillna(0)), color=color, alpha=0.2, linewidth=0)
        ax.plot(train_curve.index, 100 * train_curve.values, color=color, linestyle=":", linewidth=1.2)
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


fig, axes = plt.subplots(1, len(layers), figsize=(4.4 * len(layers), 3.8), sharey=True, squeeze=False)
for ax, L in zip(axes[0], layers):
    plot_curves(ax, history[history.layers == L], methods)
    ax.set_title(f"{L} layers, {L} heads")
axes[0, 0].set_ylabel("accuracy (%)")
axes[0, -1].legend(loc="lower right", fontsize="small")
fig.tight_layout()
plots.save_figure(fig, "fig-sentiment-curves", data=history)

# %% [markdown]
# ```{glue:figure} fig-sentiment-curves
# :name: fig-sentiment-curves
#
# Test accuracy against epoch (solid: mean over seeds, band: ± one standard deviation) and training
# accuracy (dotted, mean), per method and depth. Numbers: `_build/results/fig-sentiment-curves.csv`.
# ```

# %% [markdown]
# ## Longer training: does the ranking hold?
#
# A budget of a few epochs compares how fast the methods start, not where they end; the paper trains
# to 99.5 % training accuracy. Here $\ell_{1.1}$ and GD (the pair of the paper's claim) train longer
# at the sweep's depth, with the same step sizes.

# %% tags=["hide-input", "remove-stderr"]
pair = [k for k in ("1.1", "2") if k in methods]
long_lrs = sentiment.table_step_sizes([sweep_layers], pair, chosen, step_sizes)
_, _, long_history = sentiment.grid(long_lrs, long_seeds, workers=workers, **(settings | {"epochs": long_epochs}))
fig, ax = plt.subplots(figsize=(6.4, 3.9))
plot_curves(ax, long_history, pair)
ax.set_ylabel("accuracy (%)")
ax.set_title(f"{sweep_layers} layers, {long_seeds} seeds, up to {long_epochs} epochs")
ax.legend(loc="lower right", fontsize="small")
fig.tight_layout()
plots.save_figure(fig, "fig-sentiment-long", data=long_history)
ends = long_history.groupby(["method", "seed"]).agg(best=("test_accuracy", "max"), train=("train_accuracy", "last"))
ends = ends.groupby("method").mean()
glue("long-summary", "; ".join(f"{plots.method_text(*sentiment.method(k))} {100 * ends.loc[k, 'best']:.2f} % "
                               f"(final training accuracy {100 * ends.loc[k, 'train']:.1f} %)" for k in pair),
     display=False)

# %% [markdown]
# ```{glue:figure} fig-sentiment-long
# :name: fig-sentiment-long
#
# $\ell_{1.1}$ against GD trained longer (same step sizes as above): test accuracy (mean and band over
# seeds) and training accuracy (dotted). Numbers: `_build/results/fig-sentiment-long.csv`.
# ```
#
# Best test accuracy of the longer runs (mean over seeds), with the final training accuracy:
# {glue:text}`long-summary`.
#
# ## What we got, next to the paper
#
# This page was computed on {glue:text}`t1-data`. Among the $\ell_p$ methods, the best mean in each
# row is {glue:text}`t1-best`; the $\ell_{1.1}$ minus GD differences are {glue:text}`t1-gaps` points
# ({glue:text}`t1-layers` layers; the paper: +1.81 / +2.31 / +1.43 at 3 / 4 / 6 layers). Adam, the
# extra column, reaches {glue:text}`t1-adam` %.
#
# **What this shows.** At the default profile's budget the comparison is one of early training: the
# mirror-descent models are still far from fitting the training set (the dotted curves), while Adam
# fits it within a few epochs. What decides the $\ell_p$ ranking here is how fast each geometry makes
# progress from this initialization, and the differences between the three exponents are of the size
# of the seed-to-seed spread. Trained three times longer, $\ell_{1.1}$ and GD end level
# ({numref}`fig-sentiment-long`): the early gap is a matter of speed, not of where the two
# geometries arrive at this scale. **What it does not show.** It does not test the paper's claim, which is
# about models trained to 99.5 % training accuracy on IMDb: that is the `paper` profile (IMDb, width
# 384, the paper's step sizes, up to 1000 epochs, 10 seeds; a GPU). Nor is "best test accuracy over
# epochs", the paper's metric, an unbiased estimate: it selects the epoch on the test set. We report
# it to be comparable and keep the last epoch's accuracy in `table-1.csv`.
