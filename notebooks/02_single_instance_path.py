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
# # One instance, up close: the path, the norm and the rate (E2)
#
# **The claims.** For a fixed decoder, the paper's Theorem 8 says that $\ell_p$ mirror descent
# {eq}`eq-md-update` with a small enough constant step lets $\|W(k)\|$ grow without bound, and only
# logarithmically in $k$; Theorem 10 says that the direction $W(k)/\|W(k)\|_p$ converges to the
# $\ell_p$ attention SVM $W^{\mathrm{mm}}_p$ {eq}`eq-attention-svm` of the selected tokens; Theorem 11
# bounds the directional Bregman divergence {eq}`eq-bregman` by an inverse-logarithmic rate in $k$
# {cite}`julistiono2026mirror`. The conditions are those of the
# previous chapter (a logistic-type loss, small steps, locally optimal tokens, a start in a cone
# around the SVM direction with a large norm).
#
# **What we run.** One Gaussian instance (unit-norm tokens, comparison tokens and decoder, random
# labels), $W(0) = 0$, for each $p$ two runs: the paper's normalized step (its picture of the path)
# and plain mirror descent with a constant step (the theorems' setting, where the growth and the rate
# are about $k$ itself).

# %% tags=["parameters"]
profile = "default"  # the params/ profile that produced this page (set by the pipeline)
ps = [1.75, 2.0, 3.0]  # exponents p of mirror descent (and of each path's SVM)
normalized_steps = 2000  # steps of the normalized run (the paper's picture)
lr = 0.1  # step size of the normalized run
plain_steps = 100000  # steps of the plain (unnormalized) run, the setting of Theorems 8 and 11
plain_lr = 0.5  # constant step size of the plain run
n = 2  # examples in the instance
T = 3  # tokens per example
d = 3  # embedding dimension (W has d*d entries; two of them are drawn)
seed = 1  # the instance's seed

# %%
import numpy as np
from myst_nb import glue

from mdlib.book import artifacts, plots
from mdlib.experiments import synthetic

plots.set_theme()
config = dict(ps=ps, normalized_steps=normalized_steps, lr=lr, plain_steps=plain_steps, plain_lr=plain_lr, n=n, T=T,
              d=d, seed=seed, points=300)
result = synthetic.single_instance_experiment(config, progress=True)
paths, curves, solutions = result["paths"], result["curves"], result["svm"]
print(f"profile={profile}: seed {seed}, n={n}, T={T}, d={d}; normalized: {normalized_steps} steps at {lr}; "
      f"plain: {plain_steps} steps at {plain_lr}")
solutions

# %% [markdown]
# ## The path in two coordinates
#
# Of the $d^2$ entries of $W$ we draw the two on which the SVM directions of the different
# exponents disagree most. Left: the path $W(k)$ itself from the origin, with the ray of its own
# SVM direction (dashed). Right: the direction $W(k)/\|W(k)\|_p$ in the same two coordinates,
# which travels to the point of its own SVM direction (star).

# %% tags=["hide-input"]
normalized = paths[paths.method == "normalized"]
fig, entries = plots.e2_path_figure(normalized, curves[curves.method == "normalized"], ps)
artifacts.save_figure(fig, "fig-e2-path", data=normalized[normalized.entry.isin(entries)])

# %% [markdown]
# ```{glue:figure} fig-e2-path
# :name: fig-e2-path
#
# Two entries of $W(k)$ under normalized $\ell_p$ mirror descent from $W(0) = 0$. Left: the path
# and the ray of the $\ell_p$ attention SVM's direction (dashed). Right: the normalized iterate and
# the normalized SVM solution (star) in the same coordinates. Numbers: `_build/results/fig-e2-path.csv`.
# ```
#
# ## Norm growth, saturation and the rate (plain steps)

# %% tags=["hide-input"]
plain = curves[(curves.method == "plain") & (curves.step > 0)]
fig = plots.e2_growth_figure(plain, ps)
artifacts.save_figure(fig, "fig-e2-norm-growth", data=plain)

# %% tags=["hide-input"]
# Slope of the norm against log k over the last decade of steps, and the late rate of the divergence.
late = {}
for p in ps:
    c = plain[(plain.p == p) & (plain.step >= plain.step.max() / 10)]
    slope = np.polyfit(np.log(c.step), c.norm, 1)[0]
    ratio = c.norm.iloc[-1] / c.norm.iloc[0]
    late[p] = (slope, ratio, float(c.divergence.iloc[-1]))
    glue(f"e2-slope-{p:g}", float(slope), display=False)
    glue(f"e2-div-{p:g}", float(c.divergence.iloc[-1]), display=False)
    glue(f"e2-growth-{p:g}", float(ratio), display=False)
for p in ps:
    c = curves[(curves.method == "normalized") & (curves.p == p)]
    glue(f"e2-ndiv-{p:g}", float(c.divergence.iloc[-1]), display=False)
glue("e2-plain-steps", plain_steps, display=False)
glue("e2-normalized-steps", normalized_steps, display=False)
glue("e2-all-optimal", "all" if solutions.globally_optimal.all() else "not all", display=False)

# %% [markdown]
# ```{glue:figure} fig-e2-norm-growth
# :name: fig-e2-norm-growth
#
# Plain $\ell_p$ mirror descent (constant step) on the same instance. Left: $\|W(k)\|_p$ against
# $\log k$, a straight line when the growth is logarithmic (Theorem 8). Middle: the attention left
# off the selected token, which vanishes as the norm grows. Right: the directional Bregman divergence
# to the path's own SVM (Theorem 11). Numbers: `_build/results/fig-e2-norm-growth.csv`.
# ```
#
# ## What we got, next to the paper
#
# - **Growth (Theorem 8).** Over the last decade of the {glue:text}`e2-plain-steps` plain steps the
#   norm keeps rising along a straight line in $\log k$: slope {glue:text}`e2-slope-1.75:.3f`
#   ($p = 1.75$), {glue:text}`e2-slope-2:.3f` ($p = 2$), {glue:text}`e2-slope-3:.3f` ($p = 3$) per
#   unit of $\log k$, while $k$ grows tenfold and the norm only by a factor
#   {glue:text}`e2-growth-1.75:.2f`, {glue:text}`e2-growth-2:.2f` and {glue:text}`e2-growth-3:.2f`.
# - **Direction (Theorems 10 and 11).** The divergence to the own SVM falls steadily on the log
#   axis and ends at {glue:text}`e2-div-1.75:.2e`, {glue:text}`e2-div-2:.2e` and
#   {glue:text}`e2-div-3:.2e`. The normalized paths of {numref}`fig-e2-path` bend towards their own
#   SVM directions, as in the paper's picture, and after {glue:text}`e2-normalized-steps` steps sit
#   at divergence {glue:text}`e2-ndiv-1.75:.1e`, {glue:text}`e2-ndiv-2:.1e` and
#   {glue:text}`e2-ndiv-3:.1e`: the larger exponent travels the longest way and is still on it. The
#   selected tokens are {glue:text}`e2-all-optimal` globally optimal (table above).
#
# **What this shows.** The three regimes the theory separates: unbounded but logarithmic growth of
# the norm, a softmax that saturates on one token per example, and a direction that approaches the
# $\ell_p$ max-margin solution slowly. **What it does not show.** One instance is an illustration,
# not a statistic (the previous chapter has 100 seeds), and the plain run's step is chosen small
# enough to be stable here, not from the theorem's bound.
