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
# counting entries with $|w| >$ {glue:text}`paper-threshold`: {glue:text}`paper-kqv`
# {cite}`julistiono2026mirror`. A count
# above a threshold is not a sparsity result: it depends on the scale of the weights, which follows
# the step size and the length of training, and nothing is removed.
#
# **What we run.** The trained models of the Table 1 chapter at one depth: the grid chapter 04 names
# for analysis (its parameter `analysed`: at the default, the judged variation, whose runs reach the
# stop rule; at the paper's scale, the authors' setup) at this page's profile (or the one the
# parameter `table1` names), read back from the results store, nothing retrained. We repeat the paper's count, with the count at initialization as the reference
# it needs; then measure what training changed, $\Delta W = W - W(0)$, with scale-free measures that
# no threshold or step size sets (the verdicts), against GD and against what $\ell_{1.1}$'s own
# initialization predicts; then prune: global magnitude pruning of the
# attention, MLP and classifier matrices (the smallest $|w|$ set to zero, from 0 to 95 % of their
# entries, without retraining), and the test accuracy that survives. The embedding tables are left
# out of the pruning: they are most of the model's weights, and on their own scale ($N(0, 1)$ in the
# authors' setup, larger than any matrix entry; $N(0, 0.02^2)$ in the variation, smaller than most),
# so a threshold over both would remove one kind first, whatever the training did.

# %% tags=["parameters"]
profile = "default"  # the params/ profile that produced this page (set by the pipeline)
table1 = ""  # the Table 1 grid to read: the profile chapter 04 built it at ("": this page's profile)
depth = 3  # the depth (and heads) of the inspected models: one of the grid's layers (the paper's: 6)
threshold = 0.06  # |w| threshold of the paper's count at width 384; scaled by sqrt(384 / width) below
top_fraction = 0.01  # the scale-free measure: share of ||W - W(0)||^2 in the largest 1 % of the entries
sparsities = [0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95]  # fractions of the matrices' weights pruned

# %% tags=["remove-stderr"]
import pandas as pd
from myst_nb import glue

from mdlib.book import artifacts, plots, provenance, scorecard
from mdlib.book.views.sentiment import weighting_reading
from mdlib.experiments.methods import key_text, method
from mdlib.experiments import analysis, estimates, paper, selection, sentiment, sparsity, sparsity_null, train

plots.set_theme()
artifacts.glue_paper()
grid = sentiment.built_grid(table1 or profile, depth, provenance.notebook_run()["variant"])
dataset, max_length, width, methods = grid.config.dataset, grid.config.max_length, grid.config.width, grid.config.methods
models = {(key, seed): model for (L, key, seed), model in grid.models().items() if L == depth}
initial = {seed: sentiment.initial_model(grid.configs[depth, key, seed]).eval() for key, seed in models}
label = {key: plots.method_label(*method(key)) for key in methods} | {"init": "initialization"}
names = " / ".join(key_text(k) for k in methods)
entries = depth * width * width
scaled = analysis.scaled_threshold(width, paper.KQV_WIDTH, threshold)  # the same multiple of the init bound
print(f"profile={profile}: {len(models)} models ({dataset}, {depth} layers, width {width}); threshold {scaled:.3f}; "
      f"{entries} entries per kind (K, Q or V)")

# %% [markdown]
# ## The paper's count

# %% tags=["hide-input"]
counts = sparsity.counts_table({("init", s): m for s, m in initial.items()} | models, scaled, threshold)
shown = counts.groupby("method", sort=False)[list(sparsity.KINDS.values())].agg(["mean", "std"])
table = pd.DataFrame({"method": [label[k] for k in shown.index]} | {
    kind: [f"{shown.loc[k, (kind, 'mean')]:.0f} ± {shown.loc[k, (kind, 'std')]:.0f}".replace(" ± nan", "")
           for k in shown.index] for kind in sparsity.KINDS.values()})
reported = pd.DataFrame([{"method": name, **dict(zip("KQV", map(str, paper.KQV_ABOVE[key])))} for key, name in
                         (("1.1", "paper ℓ1.1 (IMDb, 6 layers, width 384)"), ("2", "paper ℓ2 (GD)"))])
artifacts.save_table(counts, "table-weights-kqv", styled=pd.concat([table, reported], ignore_index=True).style.hide(axis="index"))
shares = counts.groupby("method")[list(sparsity.KINDS.values())].mean().sum(axis=1) / (3 * entries)
glue("w-shares", " / ".join(f"{shares[k]:.2%}" for k in ["init"] + methods), display=False)
glue("w-threshold", f"{scaled:.3f}", display=False)

# %% [markdown]
# ```{glue:figure} table-weights-kqv
# :name: table-weights-kqv
#
# Entries of the key, query and value matrices (all layers) above the threshold {glue:text}`w-threshold`
# (the paper's 0.06 at width 384, scaled with the initialization's bound $1/\sqrt{\text{width}}$,
# so that no entry starts above it): mean ± standard deviation over seeds, at initialization and
# after training, next to the paper's counts. Per seed (also above the absolute 0.06):
# `_build/results/table-weights-kqv.csv`.
# ```
#
# ## What training changed

# %% tags=["hide-input"]
change = sparsity.change_table(models, initial, top_fraction).merge(sparsity_null.null_table(models, initial)).merge(
    grid.runs[grid.runs.chosen & (grid.runs.layers == depth)][["method", "seed", "epochs", "reached"]])
summary = change.groupby("method", sort=False)[["top_share", "effective_density", "weighting_null_density",
                                                 "relative_change", "epochs"]].mean()
artifacts.save_table(change, "table-weights-change", styled=summary.rename(index=label).reset_index().style.format(
    {"top_share": "{:.3f}", "effective_density": "{:.3f}", "weighting_null_density": "{:.3f}",
     "relative_change": "{:.3f}", "epochs": "{:.0f}"}).hide(axis="index"))
gap = estimates.density_gap(change)
dual = estimates.density_gap(change, column="dual_density")
beyond = estimates.weighting_gap(change)
glue("w-density", " / ".join(f"{summary.loc[k, 'effective_density']:.3f}" for k in methods), display=False)
glue("w-dual", " / ".join(f"{change[change.method == k].dual_density.mean():.3f}" for k in methods), display=False)
glue("w-weighting", f"{change[change.method == '1.1'].weighting_density.mean():.3f}", display=False)
glue("w-dual-gap", f"{dual.text(3)} ({dual.n} pairs)", display=False)
glue("w-null", f"{change[change.method == '1.1'].weighting_null_density.mean():.3f}", display=False)
glue("w-own", f"{summary.loc['1.1', 'effective_density']:.3f}", display=False)
glue("w-density-gap-null", f"{beyond.text(3)} ({beyond.n} seeds)", display=False)
glue("w-top", " / ".join(f"{summary.loc[k, 'top_share']:.3f}" for k in methods), display=False)
glue("w-density-gap", f"{gap.text(3)} ({gap.n} pairs)", display=False)
glue("w-methods", names, display=False)

# %% [markdown]
# ```{glue:figure} table-weights-change
# :name: table-weights-change
#
# What training changed, $\Delta W = W - W(0)$ of the K, Q and V matrices together (each model
# against its seed's initialization), measured without a threshold: the share of
# $\lVert \Delta W \rVert_2^2$ held by the largest 1 % of its entries (higher: more concentrated),
# the effective density $\lVert \Delta W \rVert_1^2 / (n \lVert \Delta W \rVert_2^2)$ (lower:
# sparser; $2/\pi \approx 0.64$ for Gaussian noise), that of the model's init-weighting null (below;
# for GD, Gaussian noise at each matrix's scale), the size of the change, and the epochs trained;
# means over seeds. Per seed, with the densities of the dual change and of the init weighting:
# `_build/results/table-weights-change.csv`.
# ```
#
# Effective density of $\Delta W$ ({glue:text}`w-methods`): {glue:text}`w-density`; top-1 % share:
# {glue:text}`w-top`. $\ell_{1.1}$ minus GD in effective density, seed by seed, with a paired 95 %
# interval: {glue:text}`w-density-gap` (negative: $\ell_{1.1}$'s change is sparser).
#
# **Against its own null.** Mirror descent sums its steps in the dual: $\Delta u = m(W) - m(W(0)) =
# -\eta \sum_k g_k$ exactly, $W = m^{-1}(m(W(0)) + \Delta u)$, and to first order
# $\Delta W = |W(0)|^{2-p} \Delta u / (p-1)$. So even summed gradients without any structure give
# $\ell_{1.1}$ a sparser $\Delta W$, weighted by the initial magnitudes $|W(0)|^{0.9}$ (for the
# authors' uniform matrices the weighting alone has an effective density of
# {glue:text}`w-weighting`; 2.8 / 1.9² ≈ 0.78 in theory). The null of each $\ell_{1.1}$ model is its
# own change with the dual change replaced by unstructured noise:
# $\Delta W_\text{null} = m^{-1}(m(W(0)) + \xi) - W(0)$, $\xi$ independent Gaussian at each matrix's
# root-mean-square dual change (the mean of seeded draws). It keeps the model's initialization, the
# exact map and how far each matrix moved, and removes only the structure of the dual change within
# the matrices; noise rather than a shuffle of $\Delta u$, which would keep the dual change's own
# concentration and count it as the weighting's. Effective density of $\ell_{1.1}$'s $\Delta W$:
# {glue:text}`w-own`; of its null: {glue:text}`w-null`; $\Delta W$ minus its null, seed by seed (the
# same model, the same initialization): {glue:text}`w-density-gap-null` (negative: sparser than the weighting
# predicts). {glue:text}`w-null-reading` Beside it, not judged: the density of the dual change
# $\Delta u$ itself (GD's is its $\Delta W$), {glue:text}`w-dual` ({glue:text}`w-methods`);
# $\ell_{1.1}$ minus GD, seed by seed: {glue:text}`w-dual-gap`.

# %% tags=["hide-input"]
colors = {k: plots.method_color(*method(k)) for k in methods} | {"init": "0.6"}
first = min(initial)
fig = plots.weight_histograms({f"seed {first}": {(label[k], colors[k]): (initial[first] if k == "init" else models[k, first])
                                                  .attention_weights() for k in ["init"] + methods}}, scaled,
                              kinds=list(sparsity.KINDS))
hist = pd.concat([pd.DataFrame({"method": k, "kind": kind, "abs_w": values[values > scaled]})
                  for k in methods for kind in sparsity.KINDS
                  for values in [analysis.magnitudes(models[k, first].attention_weights()[kind])]], ignore_index=True)
artifacts.save_figure(fig, "fig-weights-kqv", data=hist)

# %% [markdown]
# ```{glue:figure} fig-weights-kqv
# :name: fig-weights-kqv
#
# Histograms of $|w|$ above the scaled threshold of the key, query and value weights (all layers,
# the first seed), per method, counts in the legend; grey: the initialization. Values:
# `_build/results/fig-weights-kqv.csv`.
# ```
#
# ## Pruning

# %% tags=["hide-input"]
test = sentiment.by_length(sentiment.splits(dataset, 0, max_length)["test"])  # batches of similar lengths


def accuracy(model):
    return train.evaluate(model, test, batch_size=500, loss="binary", collate_fn=sentiment.collate)[1]


pruning = sparsity.pruning_table(models, sparsities, accuracy)
artifacts.save_figure(plots.pruning_curves(pruning, methods), "fig-pruning", data=pruning)
kept = pruning.groupby(["method", "sparsity"])["test_accuracy"].mean()
for s in (0.5, 0.8, 0.9):
    glue(f"prune-{int(100 * s)}", " / ".join(f"{100 * kept[k, s]:.1f}" for k in methods) if s in sparsities
         else "not measured", display=False)
glue("prune-loss-90", " / ".join(f"{100 * (kept[k, 0.0] - kept[k, 0.9]):.1f}" for k in methods)
     if {0.0, 0.9} <= set(sparsities) else "not measured", display=False)
found = scorecard.chapter_rows("06_weights")
glue("w-verdict", scorecard.verdicts_text(found), display=False)
glue("w-null-reading", weighting_reading(found), display=False)
glue("w-gate", selection.gate_text(grid, depth), display=False)

# %% [markdown]
# ```{glue:figure} fig-pruning
# :name: fig-pruning
#
# Test accuracy after global magnitude pruning of the attention, MLP and classifier matrices (not
# the embedding tables), without retraining: mean ± standard deviation over seeds; the dotted line
# is chance. Numbers: `_build/results/fig-pruning.csv`.
# ```
#
# Test accuracy (%) kept at 50 %, 80 % and 90 % of the matrices pruned ({glue:text}`w-methods`):
# {glue:text}`prune-50`; {glue:text}`prune-80`; {glue:text}`prune-90`. Loss from no pruning to 90 %,
# in points: {glue:text}`prune-loss-90`.
#
# ## What it shows, and what it does not
#
# **The verdicts** (the scorecard's rules on the numbers above): {glue:text}`w-verdict`. The models:
# {glue:text}`w-gate`.
#
# **The count.** The share of K, Q and V entries above the scaled threshold is {glue:text}`w-shares`
# (initialization, then {glue:text}`w-methods`). With the authors' matrices (kept by the variation)
# no entry starts above it (uniform within $\pm 1/\sqrt{\text{width}}$), so, as in the paper, the count measures how
# many weights training pushed past it. It also grows with the step size and the length of
# training, not only with the geometry: the methods here train with different step sizes, so the
# count is shown, not judged. **The change itself.** The scale-free measures of $W - W(0)$ do not
# depend on a threshold or on the size of the change; the verdicts compare the effective density
# seed by seed, with GD's and with $\ell_{1.1}$'s own init-weighting null. A sparser change than
# GD's is not yet a sparser learned change: the initial magnitudes weight $\ell_{1.1}$'s steps
# whatever it learns, and only a change sparser than its null is sparser than that weighting
# predicts. **The pruning.** The accuracy a method keeps at high sparsity of its matrices,
# relative to its own unpruned accuracy, is the measurement that matters for "sparser weights".
# **What it does not show.** No retraining after pruning (which is how pruning is used in practice)
# and one pruning criterion; at the default profile narrow models on short sentences, and the
# verdicts count only for models trained to the stop rule that generalize (chapter 04).
