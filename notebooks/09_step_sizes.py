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
# # Step sizes for $\ell_p$ mirror descent (a guide)
#
# **The question.** `LpMirrorDescent(params, lr, p)` takes a step size `lr` whose meaning changes with
# $p$: a step size that trains well at one exponent may not move the model at another, or make it
# overflow. This page says how far one step moves a parameter, gives a rule of thumb for choosing
# `lr` at a given $p$ (`mdlib.matched_lr`), and measures it on a small model. It makes no claim of the
# paper's and is not judged on the scorecard.
#
# **How far a step moves an entry.** The step {eq}`eq-md-update` updates the dual variable
# $u = m(w) = \operatorname{sign}(w)|w|^{p-1}$ by $-\eta g$ and maps it back. Since
# $m'(w) = (p-1)|w|^{p-2}$, to first order an entry $w$ with gradient $g$ moves by
#
# ```{math}
# :label: eq-effective-step
# |\Delta w| \approx \eta\, |g|\, \frac{|w|^{2-p}}{p-1},
# ```
#
# a gradient-descent step with the step size $\eta\,|w|^{2-p}/(p-1)$, which depends on the entry's own
# magnitude unless $p = 2$. The approximation holds while the step is small against $|w|$. What it
# means:
#
# - **Zero-initialized parameters (biases, LayerNorm shifts) barely move at $p < 2$.** At $w = 0$ the
#   linearization fails: one step moves the entry by exactly $(\eta|g|)^{1/(p-1)}$, at $p = 1.1$ the
#   tenth power of $\eta|g|$. At $p > 2$ it is the other way round: $\sqrt{\eta|g|}$ at $p = 3$, far
#   more than gradient descent's $\eta|g|$ for small steps.
# - **Large entries move more at $p < 2$, less at $p > 2$.** At $|w| = 1$ (a LayerNorm gain) the
#   step of $\ell_{1.1}$ is ten times that of gradient descent at the same $\eta$; that of $\ell_3$,
#   half of it.
# - **So good step sizes span orders of magnitude across $p$, and depend on the weights' scale**
#   (the initialization). `mdlib.matched_lr(sgd_lr, p, scale)` $= \eta_{\mathrm{SGD}}\,(p-1)\,
#   \mathrm{scale}^{p-2}$ is the step size whose first step moves entries of magnitude `scale` as far
#   as gradient descent at `sgd_lr`: exact for those entries to first order, too small or too large
#   for the others.

# %% tags=["parameters"]
profile = "default"  # the params/ profile that produced this page (set by the pipeline)
dataset = "rotten_tomatoes"  # sentiment sentences: "rotten_tomatoes" (offline) or "imdb" (internet)
max_length = 64  # WordPiece tokens per text, [CLS] and [SEP] included
train_size = 8455  # training sentences (a seeded, stratified subset; 8455: all of Rotten Tomatoes')
width = 16  # model width
layers = 2  # encoder layers
heads = 2  # attention heads
mlp = 64  # MLP width
dropout = 0.1  # dropout of the model
setup = "small-embeddings"  # initialization: "authors", "small-embeddings" (chapter 04's variation) or "modern"
epochs = 4  # epochs of every run (no stop rule)
batch_size = 50  # sentences per step (mean loss over the batch)
seeds = 1  # runs per step size (seeds 0..n-1: initialization, data order, dropout)
ps = [1.1, 1.75, 2.0, 3.0]  # exponents of mirror descent (2 is SGD and must be among them)
sgd_lr = 0.3  # the SGD step size every grid is matched to (its centre)
scale = 0.0  # the |w| matched_lr matches at; 0: the median |w| of the initial model's attention and MLP matrices
multiples = [0.04, 0.12, 0.36, 1.0, 3.0, 9.0]  # each p's grid: these multiples of matched_lr(sgd_lr, p, scale); at least three, at most 3x apart
adamw_lr = 1e-3  # AdamW's centre (torch's default)
adamw_multiples = [0.04, 0.12, 0.36]  # AdamW's grid: multiples of adamw_lr; at least three, at most 3x apart
grow = 2  # times a method's grid may grow on each side (a multiple 3x beyond the end) while its choice sits at that end
gradient = 0.01  # the per-entry gradient of the first-step table
magnitudes = [0.0, 0.02, 1.0, 4.0]  # entry magnitudes of the first-step table (the matched scale is added)
workers = 2  # runs trained at once: CPU processes of one thread each, or one process per GPU when several are visible

# %% tags=["remove-stderr"]
from myst_nb import glue

from mdlib.book import artifacts, plots
from mdlib.book.views.step_size_guide import best_view, first_step_view, movement_view, summary_texts, task_text
from mdlib.experiments import step_size_guide

plots.set_theme()
config = step_size_guide.chapter_config(
    dataset=dataset, max_length=max_length, train_size=train_size, width=width, layers=layers, heads=heads, mlp=mlp,
    dropout=dropout, setup=setup, epochs=epochs, batch_size=batch_size, seeds=seeds, ps=ps, sgd_lr=sgd_lr, scale=scale,
    multiples=multiples, adamw_lr=adamw_lr, adamw_multiples=adamw_multiples, grow=grow)
result = step_size_guide.sweep(config, workers=workers)  # read back from the results store, or trained
moved = result.movement()  # ||W - W(0)|| / ||W(0)|| per parameter group of the chosen runs
for name, text in summary_texts(result, moved).items():
    glue(f"steps-{name}", text, display=False)
glue("steps-scale", f"{config.scale:g}", display=False)
glue("steps-gradient", f"{gradient:g}", display=False)
glue("steps-task", task_text(config), display=False)
print(f"profile={profile}: {task_text(config)}")

# %% [markdown]
# ## One step, exactly
#
# One step from entries of several magnitudes, each $p$ at `matched_lr(sgd_lr, p, scale)` with the
# matched scale {glue:text}`steps-scale` (below), computed in float64 by `mdlib.mirror_step`: how far
# each entry moves, as a multiple of how far gradient descent at `sgd_lr` moves it, and in brackets
# what the linearization {eq}`eq-effective-step` predicts, $(|w| / \mathrm{scale})^{2-p}$.

# %% tags=["hide-input"]
first = step_size_guide.first_step_table(ps, sorted({*magnitudes, config.scale}), sgd_lr, config.scale, gradient)
artifacts.save_table(first, "table-steps-first-step", styled=first_step_view(first).style)

# %% [markdown]
# ```{glue:figure} table-steps-first-step
# :name: table-steps-first-step
#
# One mirror-descent step at each $p$'s matched step size from an entry of magnitude $|w|$ (rows), with
# a gradient of {glue:text}`steps-gradient` per entry: the entry's movement over gradient descent's,
# exact (float64), and the linearized prediction in brackets. The row of the matched scale is 1 up to
# the linearization's error. The prediction fails at $|w| = 0$, and wherever the dual step $\eta|g|$
# is not small against $|w|^{p-1}$ (at $p = 3$, entries much smaller than the scale). Numbers:
# `_build/results/table-steps-first-step.csv`.
# ```
#
# ## A sweep of step sizes
#
# **The task.** {glue:text}`steps-task`. The test split is never read: every choice below is made on
# the validation split. **The sweep.** For every $p$ the step sizes are the same multiples of
# `matched_lr(sgd_lr, p, scale)`, so if the rule held every curve would have its minimum at the same
# multiple; AdamW has a grid of its own. Every grid has at least three multiples at most 3x apart,
# and each method's step size is chosen by the rule every grid of the book follows: the lowest final
# validation loss, every step within 1.96 paired standard errors of it tied with it (the error of two
# steps' difference in loss on the same validation sentences, from each run's per-sentence losses;
# with one seed per step it counts the sentences only, not the spread between seeds), and the tie
# going to its middle step, so that neither small nor large steps win ties. A choice at an end of the
# multiples tried adds a multiple 3x beyond that end and the method is chosen again (`grow` times at
# most per side). A run that overflows (mirror descent raises FloatingPointError rather than
# write infinities) or ends with a non-finite loss is recorded as diverged, never chosen, and never
# trained again on a re-render. Torch's SGD at $p = 2$'s chosen step size checks the implementation:
# it is the same update as mirror descent at $p = 2$.

# %% tags=["hide-input"]
fig = plots.step_size_figure(result.runs)
artifacts.save_figure(fig, "fig-steps-sweep", data=result.runs)

# %% [markdown]
# ```{glue:figure} fig-steps-sweep
# :name: fig-steps-sweep
#
# Final validation loss (top) and accuracy (bottom) after the sweep's training, against the step size
# (left) and against the SGD step size matched to it, $\eta / ((p-1)\,\mathrm{scale}^{p-2})$ (right:
# where the rule holds the curves line up). Open circles: each $p$'s chosen step; crosses at the top:
# diverged runs. Dashed: AdamW at its chosen step; dotted: torch's SGD at $p = 2$'s. Numbers (one row
# per run): `_build/results/fig-steps-sweep.csv`.
# ```

# %% tags=["hide-input"]
artifacts.save_table(result.best, "table-steps-best", styled=best_view(result.best).style.hide(axis="index"))
artifacts.save_table(moved, "table-steps-movement", styled=movement_view(moved).style)

# %% [markdown]
# ```{glue:figure} table-steps-best
# :name: table-steps-best
#
# Each method's chosen step size (the rule above) and its validation loss and accuracy, the multiples
# it tried (grown ones included) and those tied with the choice; for
# mirror descent, the step `matched_lr` predicts from the chosen SGD ($p = 2$) step, the ratio chosen /
# predicted, and the scale at which the prediction would have been exact (ill-determined near $p = 2$:
# a factor $r$ in the step size is a factor $r^{1/|p-2|}$ in the scale). Numbers:
# `_build/results/table-steps-best.csv`.
# ```
#
# ```{glue:figure} table-steps-movement
# :name: table-steps-movement
#
# How far training moved each part of the model at each method's chosen step size,
# $\|W - W(0)\|_F / \|W(0)\|_F$: the position embeddings (entries about 0.02), the attention and MLP
# matrices (about the matched scale) and the LayerNorm gains (1). Numbers:
# `_build/results/table-steps-movement.csv`.
# ```
#
# ## What we got
#
# The chosen step sizes ({numref}`table-steps-best`) are {glue:text}`steps-best`. Chosen over predicted:
# {glue:text}`steps-ratios`; for {glue:text}`steps-agreement` of the exponents other than 2 the choice
# is within one step of the grid of `matched_lr`'s prediction from SGD's. The scale at which the
# prediction would be exact: {glue:text}`steps-implied` (the rule used {glue:text}`steps-scale`, the
# matrices'). The choice is {glue:text}`steps-edges`. Tied with a choice: {glue:text}`steps-ties`.
# {glue:text}`steps-overflows`. The lowest
# validation loss of mirror descent is {glue:text}`steps-best-md-loss` ({glue:text}`steps-best-md`,
# accuracy {glue:text}`steps-best-md-accuracy`); AdamW's {glue:text}`steps-adamw-loss` (accuracy
# {glue:text}`steps-adamw-accuracy`). Torch's SGD and mirror descent at $p = 2$, same step and seed,
# differ in validation loss by {glue:text}`steps-sgd-check`.
#
# **What this shows.** On this task each exponent has its own best step size, and
# {glue:text}`steps-spread` ({numref}`fig-steps-sweep`: the right-hand panels against the left).
# Where the choice and the prediction part, the implied scale says which entries set the step size:
# the rule assumes that the entries that must move are those of the matched magnitude. The geometry
# {eq}`eq-effective-step` shows in what moved ({numref}`table-steps-movement`): the LayerNorm gains'
# relative movement (entries of magnitude 1) over the position embeddings' (magnitude 0.02) is
# {glue:text}`steps-movement`; the linearization says it should fall as $p$ grows, since a step
# scales an entry's movement by $|w|^{2-p}$.
#
# **How to choose `lr` for a given $p$.** Start from a step size that works for SGD on the problem
# (or a guess), convert it with `matched_lr(sgd_lr, p, scale)` at the magnitude of the weights that
# must learn (the median $|w|$ of the weight matrices at initialization is a start), and sweep a factor
# of 10 on each side on a validation split: the rule is a centre, not an answer. At $p < 2$, parameters
# that start at zero barely move: give them another initialization, or their own parameter group with
# $p = 2$. At $p > 2$, small entries (embeddings drawn at 0.02, zero-initialized biases) move fastest
# and tend to limit the step size. Near 1, watch for a FloatingPointError: the inverse map
# $|u|^{1/(p-1)}$ overflows float32 when a large dual value builds up, which can take many steps.
#
# **One step per tensor.** A model's tensors start at different scales (embeddings at 0.02 or 1,
# matrices at $1/\sqrt{\text{fan in}}$, LayerNorm gains at 1), and one global step gives each of
# them a different effective step: at $p = 1.1$ the gains move fastest and cap the step size, while
# small embeddings barely move. `mdlib.matched_param_groups(model.parameters(), sgd_lr, p)` gives
# every tensor its own step, `matched_lr` at that tensor's mean $|w|$, so that every tensor starts
# moving as far as under SGD at `sgd_lr` (an all-zero tensor has no matched step and keeps `sgd_lr`:
# give it its own group if that is not what it needs); pass the groups to `LpMirrorDescent` as they
# are. It is what porting an SGD script asks for, and what chapter 04's 2 × 2 uses to take Table 1's
# gap apart into the geometry of the step and its allocation (`reference_p` matches another exponent
# instead of SGD).
#
# **What it does not show.** One small task (a two-layer encoder of width 16, a few epochs, one data
# set), {glue:text}`steps-seeds`, grids 3x apart. One seed cannot tell apart step sizes whose losses
# differ by little: when we built this page, the same SGD run trained with two CPU threads instead of
# one (sums rounded in another order, nothing else changed) ended at a validation loss about 0.01
# away, which is the size of several differences between neighbouring step sizes in
# {numref}`fig-steps-sweep`. The tie rule counts the sentences' part of that uncertainty, not the
# seeds': with one seed, a tie it does not call may still be one another seed would break the other
# way (`-p seeds 3` measures it). The best step size after more epochs, at another width or
# initialization, or with a schedule may differ. The rule matches only the first step at one
# magnitude; it says nothing of momentum, weight decay or normalized steps.
