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
# # Are the weights sparser? (E6)
#
# **The claim.** Mirror descent with $p$ near 1 follows the geometry of the $\ell_{1.1}$ max-margin
# problem, whose solutions are sparse; the paper suggests the trained attention weights inherit it.
# Its evidence is a histogram of the key, query and value weights of the 6-layer sentiment models,
# counting entries with $|w| > 0.06$: 18,206 / 13,964 / 7,643 (K / Q / V) for $\ell_{1.1}$ against
# 27,224 / 14,654 / 10,127 for GD, out of 884,736 entries each {cite}`julistiono2026mirror`. A count
# above a threshold is not a sparsity result: it depends on the scale of the weights, and nothing is
# removed.
#
# **What we run.** The trained models of the Table 1 chapter at one depth: the grid chapter 04 built
# at this page's profile (or the one the parameter `table1` names), read back from the results store,
# nothing retrained. We repeat the paper's count, with the count at initialization as the
# reference it needs, and then actually prune: global magnitude pruning of all weight matrices and
# embeddings (the smallest $|w|$ set to zero, from 0 to 95 % of the entries, without retraining),
# and the test accuracy that survives.

# %% tags=["parameters"]
profile = "default"  # the params/ profile that produced this page (set by the pipeline)
table1 = ""  # the Table 1 grid to read: the profile chapter 04 built it at ("": this page's profile)
depth = 3  # the depth (and heads) of the inspected models: one of the grid's layers (the paper's: 6)
threshold = 0.06  # |w| threshold of the paper's count at width 384; scaled by sqrt(384 / width) below
top_fraction = 0.01  # the scale-free measure: share of ||W - W(0)||^2 in the largest 1 % of the entries
sparsities = [0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95]  # fractions of weights pruned

# %% tags=["remove-stderr"]
import matplotlib.pyplot as plt
import pandas as pd
from myst_nb import glue

from mdlib import analysis, optim, plots, sentiment, train

plots.set_theme()
grid = sentiment.built_grid(table1 or profile, depth)
dataset, max_length, width, seeds, methods = map(grid.config.get, ("dataset", "max_length", "width", "seeds", "methods"))
models = {(key, seed): model for (L, key, seed), model in grid.models().items() if L == depth}
initial = {seed: sentiment.initial_model(grid.configs[depth, methods[0], seed]).eval()
           for seed in range(seeds)}  # a seed gives the same initialization for every method
label = {key: plots.method_label(*optim.method(key)) for key in methods} | {"init": "initialization"}
entries = depth * width * width
# The paper's 0.06 at width 384 is above the authors' init bound 1/sqrt(384) = 0.051: the same
# threshold relative to the bound 1/sqrt(width) at this width.
scaled = threshold * (384 / width) ** 0.5
print(f"profile={profile}: {len(models)} models ({dataset}, {depth} layers, width {width}); threshold {scaled:.3f}; "
      f"{entries} entries per kind (K, Q or V)")

# %% [markdown]
# ## The paper's count

# %% tags=["hide-input"]
kinds = {"key": "K", "query": "Q", "value": "V"}
rows = []
for (key, seed), model in [(("init", s), m) for s, m in initial.items()] + list(models.items()):
    weights = model.attention_weights()
    rows.append({"method": key, "seed": seed} |
                {kinds[k]: analysis.count_above(weights[k], scaled) for k in kinds} |
                {f"{kinds[k]} > {threshold:g}": analysis.count_above(weights[k], threshold) for k in kinds})
counts = pd.DataFrame(rows)
summary = counts.groupby("method", sort=False)[list(kinds.values())].agg(["mean", "std"])
table = pd.DataFrame({"method": [label[k] for k in summary.index]} |
                     {kind: [f"{summary.loc[k, (kind, 'mean')]:.0f} ± {summary.loc[k, (kind, 'std')]:.0f}"
                             for k in summary.index] for kind in kinds.values()})
table["share above (mean of K, Q, V)"] = [f"{summary.loc[k, [(v, 'mean') for v in kinds.values()]].mean() / entries:.1%}"
                                          for k in summary.index]
paper = pd.DataFrame([{"method": "paper ℓ1.1 (IMDb, 6 layers, width 384)", "K": "18206", "Q": "13964", "V": "7643",
                       "share above (mean of K, Q, V)": f"{(18206 + 13964 + 7643) / 3 / 884736:.1%}"},
                      {"method": "paper ℓ2 (GD)", "K": "27224", "Q": "14654", "V": "10127",
                       "share above (mean of K, Q, V)": f"{(27224 + 14654 + 10127) / 3 / 884736:.1%}"}])
table["K, Q, V > 0.06 (absolute)"] = [" / ".join(f"{counts[counts.method == k][f'{v} > {threshold:g}'].mean():.0f}"
                                                for v in kinds.values()) for k in summary.index]
table = pd.concat([table, paper], ignore_index=True).fillna("")
plots.save_table(counts, "table-weights-kqv", styled=table.style.hide(axis="index"))
shares = counts.groupby("method")[list(kinds.values())].mean().sum(axis=1) / (3 * entries)
glue("w-shares", " / ".join(f"{shares[k]:.2%}" for k in ["init"] + methods), display=False)
glue("w-threshold", f"{scaled:.3f}", display=False)

# the learned change W - W(0) of the K, Q and V matrices together: scale-free
rows = []
for (key, seed), model in models.items():
    start = initial[seed].attention_weights()
    delta = [w - w0 for kind in kinds for w, w0 in zip(model.attention_weights()[kind], start[kind])]
    rows.append({"method": key, "seed": seed, "top_share": analysis.top_share(delta, top_fraction),
                 "effective_density": analysis.effective_density(delta),
                 "relative_change": float(sum(d.norm() ** 2 for d in delta) ** 0.5
                                          / sum(w.norm() ** 2 for ws in start.values() for w in ws) ** 0.5),
                 "epochs": int(grid.runs[grid.runs.chosen].set_index(["layers", "method", "seed"]).loc[(depth, key, seed), "epochs"])})
change = pd.DataFrame(rows)
summary = change.groupby("method", sort=False).agg(["mean", "std"])
shown = pd.DataFrame({"method": [label[k] for k in summary.index],
                      f"top {top_fraction:.0%} share of ‖ΔW‖²": [f"{summary.loc[k, ('top_share', 'mean')]:.3f} ± {summary.loc[k, ('top_share', 'std')]:.3f}" for k in summary.index],
                      "effective density ‖ΔW‖₁²/(n‖ΔW‖₂²)": [f"{summary.loc[k, ('effective_density', 'mean')]:.3f} ± {summary.loc[k, ('effective_density', 'std')]:.3f}" for k in summary.index],
                      "‖ΔW‖ / ‖W(0)‖": [f"{summary.loc[k, ('relative_change', 'mean')]:.2f}" for k in summary.index],
                      "epochs": [f"{summary.loc[k, ('epochs', 'mean')]:.0f}" for k in summary.index]})
plots.save_table(change, "table-weights-change", styled=shown.style.hide(axis="index"))
glue("w-top", " / ".join(f"{summary.loc[k, ('top_share', 'mean')]:.3f}" for k in methods), display=False)
glue("w-density", " / ".join(f"{summary.loc[k, ('effective_density', 'mean')]:.3f}" for k in methods), display=False)

# %% [markdown]
# ```{glue:figure} table-weights-kqv
# :name: table-weights-kqv
#
# Entries of the key, query and value matrices (all layers) above the threshold {glue:text}`w-threshold`
# (the paper's 0.06 at width 384, scaled with the initialization's bound $1/\sqrt{\text{width}}$,
# so that no entry starts above it), and above the absolute 0.06: mean ± standard deviation over
# seeds, at initialization and after training, next to the paper's counts. Per seed:
# `_build/results/table-weights-kqv.csv`.
# ```
#
# ```{glue:figure} table-weights-change
# :name: table-weights-change
#
# What training changed, $\Delta W = W - W(0)$ of the K, Q and V matrices together (seed by seed,
# against the run's own initialization), measured without a threshold: the share of
# $\lVert \Delta W \rVert_2^2$ held by the largest 1 % of its entries (higher: more concentrated),
# the effective density $\lVert \Delta W \rVert_1^2 / (n \lVert \Delta W \rVert_2^2)$ (lower:
# sparser; $2/\pi \approx 0.64$ for Gaussian noise), the size of the change, and the epochs to the
# stop rule. Per seed: `_build/results/table-weights-change.csv`.
# ```

# %% tags=["hide-input"]
def abs_weights(model, kind):
    return analysis.magnitudes(model.attention_weights()[kind])


colors = {k: plots.method_color(*optim.method(k)) for k in methods} | {"init": "0.6"}
fig, axes = plt.subplots(1, 3, figsize=(14, 3.9), sharey=True)
for ax, (kind, short) in zip(axes, kinds.items()):
    plots.magnitude_histogram(ax, {(label[k], colors[k]): abs_weights(initial[0] if k == "init" else models[k, 0], kind)
                                   for k in ["init"] + methods}, scaled)
    ax.set_title(f"{short} ({kind}), seed 0")
    ax.legend(fontsize="x-small")
fig.tight_layout()
hist = pd.concat([pd.DataFrame({"method": k, "kind": kind, "abs_w": values[values > scaled]})
                  for k in methods for kind in kinds for values in [abs_weights(models[k, 0], kind)]],
                 ignore_index=True)
plots.save_figure(fig, "fig-weights-kqv", data=hist)

# %% [markdown]
# ```{glue:figure} fig-weights-kqv
# :name: fig-weights-kqv
#
# Histograms of $|w|$ above the scaled threshold of the key, query and value weights (all layers, seed 0), per method,
# counts in the legend; grey: the initialization. Values: `_build/results/fig-weights-kqv.csv`.
# ```
#
# ## Pruning

# %% tags=["hide-input"]
test = sentiment.splits(dataset, 0, max_length)["test"]


def accuracy(model):
    return train.evaluate(model, test, batch_size=500, loss="binary", collate_fn=sentiment.collate)[1]


rows = [{"method": key, "seed": seed, "sparsity": s, "test_accuracy": a}
        for (key, seed), model in models.items() for s, a in analysis.pruning_curve(model, sparsities, accuracy)]
pruning = pd.DataFrame(rows)
fig, ax = plt.subplots(figsize=(6.8, 4))
for key in methods:
    curve = pruning[pruning.method == key].groupby("sparsity")["test_accuracy"].agg(["mean", "std"])
    color = plots.method_color(*optim.method(key))
    ax.errorbar(100 * curve.index, 100 * curve["mean"], yerr=100 * curve["std"].fillna(0), color=color,
                marker="o", markersize=3.5, capsize=2.5, label=label[key])
ax.axhline(50, color="0.5", linestyle=":", linewidth=1)
ax.set_xlabel("weights pruned (%, global magnitude, no retraining)")
ax.set_ylabel("test accuracy (%)")
ax.legend(fontsize="small")
fig.tight_layout()
plots.save_figure(fig, "fig-pruning", data=pruning)
kept = pruning.groupby(["method", "sparsity"])["test_accuracy"].mean()
for s in (0.5, 0.8, 0.9):
    glue(f"prune-{int(100 * s)}", " / ".join(f"{100 * kept[k, s]:.1f}" for k in methods) if s in sparsities
         else "not measured", display=False)
glue("prune-methods", " / ".join(plots.method_text(*optim.method(k)) for k in methods), display=False)
glue("prune-loss-90", " / ".join(f"{100 * (kept[k, 0.0] - kept[k, 0.9]):.1f}" for k in methods)
     if {0.0, 0.9} <= set(sparsities) else "not measured", display=False)

# %% [markdown]
# ```{glue:figure} fig-pruning
# :name: fig-pruning
#
# Test accuracy after global magnitude pruning of all weight matrices and embeddings, without
# retraining: mean ± standard deviation over seeds; the dotted line is chance. Numbers:
# `_build/results/fig-pruning.csv`.
# ```
#
# Test accuracy (%) kept at 50 %, 80 % and 90 % sparsity ({glue:text}`prune-methods`):
# {glue:text}`prune-50`; {glue:text}`prune-80`; {glue:text}`prune-90`. Loss from no pruning to 90 %
# sparsity, in points: {glue:text}`prune-loss-90`.
#
# ## What it shows, and what it does not
#
# **The count.** The share of K, Q and V entries above the scaled threshold is {glue:text}`w-shares`
# (initialization, then {glue:text}`prune-methods`). With the authors' initialization no entry
# starts above it (uniform within $\pm 1/\sqrt{\text{width}}$), so, as in the paper, the count
# measures how many weights training pushed past it. It also grows with the step size and the
# length of training, not only with the geometry: the methods here stop at different epochs with
# different step sizes. **The change itself.** The scale-free measures of $W - W(0)$ do not depend
# on a threshold or on the size of the change: a top-1 % share of {glue:text}`w-top` and an
# effective density of {glue:text}`w-density` ({glue:text}`prune-methods`), every model measured at
# its own stop rule. A sparser learned change under $\ell_{1.1}$ would show as a larger top share
# and a smaller density than GD's.
#
# **The pruning.** Global magnitude pruning ranks all matrices together, embeddings included; at the
# default profile the token embeddings hold most of the weights (30,522 rows). The
# accuracy a method keeps at high sparsity, relative to its own unpruned accuracy, is the
# measurement that matters for "sparser weights"; with embeddings drawn $N(0, 1)$, pruning removes
# the matrices' entries (bounded by $1/\sqrt{\text{fan in}}$) first. **What it does not show.** No
# retraining after pruning (which is how pruning is used in practice), and one pruning criterion; at
# the default profile, narrow models fitted to a
# thousand sentences, whose test accuracy is close to chance (chapter 04), so what pruning keeps is
# little to begin with.
