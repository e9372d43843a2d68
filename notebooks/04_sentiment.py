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
# ```{glue} paper-table-1
# ```
#
# with standard deviations of {glue:text}`paper-t1-std` points. Every run trains until its training
# accuracy reaches 99.5 %; in the authors' runs that took on average {glue:text}`paper-epochs` epochs
# ({glue:text}`paper-t1-layers` layers, 250 steps an epoch). (These are the outputs of the authors'
# public code, whose ten runs of a cell shared one initialization; its re-run notebook reports
# {glue:text}`paper-rerun` at 6 layers.)
#
# **What we run: the authors' setup.** The model and the training rule as the authors' public code
# runs them: token and position embeddings drawn $N(0, 1)$, torch's default uniform initialization
# of every matrix (bound $1/\sqrt{\text{fan in}}$), post-LN blocks without biases, dropout 0.2 on the
# attention probabilities and on both residual branches, a classifier without bias on the [CLS]
# token; binary cross-entropy **summed** over the batch of 100 (the paper's step sizes assume the
# sum); plain mirror descent {eq}`eq-md-update` on every parameter; training stops after the first
# epoch whose running training accuracy (dropout on) reaches 99.5 %. Mirror descent is not
# scale-invariant (by {eq}`eq-md-update`, an entry $w$ moves by about $\eta\, g\, |w|^{2-p}/(p-1)$),
# so these choices decide which layers move and how fast: they are part of the replication. What
# differs, and we state it: distinct initializations per seed; step sizes fixed per method as
# multiples of the paper's, the largest that trained stably in pilots (judged by the training
# accuracy, never by test; the notes at the end); training batches of similar lengths (below); and
# the data. The default profile runs
# offline on the Rotten Tomatoes sentences (a source the offline machines can reach; all 8,455
# training sentences, validation and test splits of 1,056 and 1,057) with a narrower model; the
# `paper` profile runs IMDb at the paper's scale and step sizes. Next to it: a bag-of-words
# baseline on the same tokens, which says whether the models learned more than word counts, and an
# ablation from another initialization.

# %% tags=["parameters"]
profile = "default"  # the params/ profile that produced this page (set by the pipeline)
dataset = "rotten_tomatoes"  # "rotten_tomatoes" (offline) or "imdb" (internet)
max_length = 64  # WordPiece tokens per text, [CLS] and [SEP] included (covers 99.9 % of the sentences)
train_size = None  # training sentences (a seeded, stratified subset; None: the whole training split)
width = 24  # model width (paper: 384); the MLP is 4 x width
layers = [3]  # numbers of layers (and heads) of the rows of Table 1 (paper: [3, 4, 6])
methods = ["1.1", "2", "3"]  # l_p exponents of mirror descent ("2" is GD); "adam" adds Adam as an extra column
seeds = {"1.1": 3, "2": 3, "3": 1}  # runs per method, seeds 0..n-1: distinct initializations, data orders and dropout
epochs = 70  # most epochs per run; a run stops at 99.5 % training accuracy
setup = "authors"  # initialization: "authors" (the replication) or "modern"
step_multiples = {"1.1": [3], "2": [10], "3": [300]}  # candidate step sizes, multiples of the paper's (Adam: of 1e-3); more than one: chosen on validation
ablation_setup = "modern"  # the ablation's initialization ("" for no ablation)
ablation_methods = ["1.1", "2"]  # methods of the ablation (at the first depth of layers)
ablation_seeds = 3  # seeds of the ablation
ablation_epochs = 150  # most epochs of an ablation run
ablation_multiples = {"1.1": [1], "2": [3]}  # the ablation's candidate step multiples
workers = 2  # runs trained at once: CPU processes of one thread each, or one process per GPU when several are visible

# %% tags=["remove-stderr"]
import pandas as pd
from myst_nb import glue

from mdlib.book import plots, scorecard
from mdlib.experiments import methods as method_keys
from mdlib.experiments import sentiment, train

plots.set_theme()
glue("paper-table-1", sentiment.paper_table1_view().style.hide(axis="index").set_table_styles(
    [{"selector": "th, td", "props": "padding: 0.1em 0.7em"}]), display=False)
plots.glue_paper()
config, ablation_config = sentiment.chapter_grids(  # Table 1's grid and the ablation's (None without one)
    dataset=dataset, max_length=max_length, train_size=train_size, width=width, setup=setup, epochs=epochs,
    layers=layers, methods=methods, seeds=seeds, step_multiples=step_multiples, ablation_setup=ablation_setup,
    ablation_methods=ablation_methods, ablation_seeds=ablation_seeds, ablation_epochs=ablation_epochs,
    ablation_multiples=ablation_multiples)
sentiment.train_grids([c for c in (config, ablation_config) if c is not None], workers=workers)  # one pool
grid = sentiment.grid(config, workers=workers, name=sentiment.grid_name(profile))  # chapters 05 and 06 read it
print(f"profile={profile}: {dataset} ({train_size or 'all'} training texts), width {width}, layers {layers}, "
      f"seeds {seeds}, <= {epochs} epochs, setup {setup!r}")
label = {key: plots.method_label(*method_keys.method(key)) for key in methods}
text = {key: plots.method_text(*method_keys.method(key)) for key in methods}

# %% [markdown]
# ## The baseline
#
# A model that learned something about sentiment should beat word counts. Two bag-of-words
# classifiers (scikit-learn) on exactly the WordPiece tokens, training sentences and splits of the
# runs below: multinomial Naive Bayes on token counts, and logistic regression on token presence
# with its regularization chosen on the validation split. The verdicts of this chapter and the
# next two count a model as generalizing when its mean test accuracy recovers at least half of the
# Naive Bayes margin over chance: 50 % + ½ (baseline − 50 %).

# %% tags=["hide-input"]
baseline = sentiment.baseline(dataset, 0, max_length, train_size)
nb = float(baseline.set_index("baseline").test_accuracy["naive_bayes"])
floor = scorecard.generalization_floor(nb)
plots.save_table(baseline, "table-sentiment-baseline", styled=sentiment.baseline_view(baseline).style.hide(axis="index"))
glue("t1-baseline", f"{nb:.1%}", display=False)
glue("t1-floor", f"{floor:.1%}", display=False)

# %% [markdown]
# ```{glue:figure} table-sentiment-baseline
# :name: table-sentiment-baseline
#
# Bag-of-words baselines on the runs' tokens and splits: validation and test accuracy.
# ```
#
# The Naive Bayes baseline reaches {glue:text}`t1-baseline` on test, so a model generalizes here at
# {glue:text}`t1-floor` or more.
#
# ## Step sizes
#
# Each method trains at the multiple of the paper's step size the pilots chose (notes at the end;
# with several candidates in a profile, seed 0 trains at each and the one that reached the stop rule
# with the best validation accuracy is kept; the test split plays no part in either). Saved as
# `_build/results/table-sentiment-steps.csv`.

# %% tags=["hide-input"]
steps = grid.runs[grid.runs.seed == 0]
plots.save_table(steps, "table-sentiment-steps", styled=sentiment.steps_view(steps).style.hide(axis="index"))

# %% [markdown]
# ```{glue:figure} table-sentiment-steps
# :name: table-sentiment-steps
#
# The step sizes (seed 0): epochs to the stop rule (or the cap), the training accuracy of the last
# epoch, the validation accuracy at the end, and the chosen multiple.
# ```
#
# ## Table 1

# %% tags=["hide-input"]
cells = sentiment.cell_table(grid.runs)
plots.save_table(cells, "table-1", styled=sentiment.table1_view(cells, nb).style.hide(axis="index"))
plots.save_table(grid.runs, "table-sentiment-runs", glue=False)
chosen = grid.runs[grid.runs.chosen]
glue("t1-reached", f"{int(chosen.reached.sum())} of {len(chosen)}", display=False)
glue("t1-data", f"{dataset}, {train_size or 'all'} training texts, width {width}, seeds "
     + ", ".join(f"{text[k]} {sentiment.seeds_of(config, k)}" for k in methods) + f", at most {epochs} epochs",
     display=False)
gaps = sentiment.paired_gaps(grid.runs)
best_gaps = sentiment.paired_gaps(grid.runs, metric="best_test")
glue("t1-gaps", sentiment.gaps_text(gaps), display=False)
glue("t1-best-gaps", sentiment.gaps_text(best_gaps), display=False)

# %% [markdown]
# ```{glue:figure} table-1
# :name: table-1
#
# The paper's Table 1 reproduced. Test accuracy (%) at the stop rule, or at the epoch cap for a run
# that did not reach it (mean ± standard deviation over seeds); the best test accuracy over epochs,
# the paper's metric, which selects the epoch on the test set; the mean number of epochs and how
# many runs reached the stop rule; the paper's IMDb numbers and the authors' epochs to the stop.
# Last row: the bag-of-words baseline on the same data. Per cell: `_build/results/table-1.csv`;
# per run: `_build/results/table-sentiment-runs.csv`.
# ```

# %% tags=["hide-input"]
plots.save_figure(plots.training_curves(grid.history, methods), "fig-sentiment-curves", data=grid.history)

# %% [markdown]
# ```{glue:figure} fig-sentiment-curves
# :name: fig-sentiment-curves
#
# Above: test accuracy against epoch (solid: mean over seeds while all of them run, band: ± one
# standard deviation) and the running training accuracy (dotted, mean; ticks: where each run
# stopped; grey line: the 99.5 % stop rule). Below: the training loss per example (dropout on, log
# scale). Every run and epoch: `_build/results/fig-sentiment-curves.csv`.
# ```
#
# ## Why the methods differ: what each one moves
#
# Mirror descent with $p$ near 1 moves an entry $w$ about $|w|^{0.9}/0.1$ times as far as GD at the
# same step. Under the authors' initialization the embedding tables are drawn $N(0, 1)$, far larger
# than the matrices ($|w| \le 1/\sqrt{\text{width}}$), so $\ell_{1.1}$ should move the embeddings
# much further than GD does, and the comparison may measure which optimizer moves the embeddings as
# much as anything else. The relative movement $\lVert W - W(0) \rVert / \lVert W(0) \rVert$ of
# each part of each trained model, against its own initialization, tests that either way.

# %% tags=["hide-input"]
moved = sentiment.movement(grid)
plots.save_figure(plots.movement_bars(moved, methods), "fig-sentiment-movement", data=moved)
ratio = moved.groupby(["group", "method"]).movement.mean().unstack().reindex(list(dict.fromkeys(moved.group)))
glue("t1-moved", "; ".join(f"{g}: " + " / ".join(f"{ratio.loc[g, k]:.3g}" for k in methods) for g in ratio.index),
     display=False)
glue("t1-moved-ratio", " / ".join(f"{g} {ratio.loc[g, '1.1'] / ratio.loc[g, '2']:.1f}×" for g in ratio.index)
     if {"1.1", "2"} <= set(methods) else "not measured", display=False)
glue("t1-methods", " / ".join(text[k] for k in methods), display=False)

# %% [markdown]
# ```{glue:figure} fig-sentiment-movement
# :name: fig-sentiment-movement
#
# Relative movement $\lVert W - W(0) \rVert_F / \lVert W(0) \rVert_F$ per group of parameters
# (embeddings: token and position tables; attention: query/key/value and output maps; MLP; the
# LayerNorm gains; the classifier), at the end of each chosen run: mean over seeds with a 95 % t
# interval (none for a single seed), log scale. Per run: `_build/results/fig-sentiment-movement.csv`.
# ```
#
# Mean relative movement ({glue:text}`t1-methods`): {glue:text}`t1-moved`. $\ell_{1.1}$ over GD:
# {glue:text}`t1-moved-ratio`.
#
# ## Ablation: does the result depend on the initialization?
#
# The paper does not state an initialization; its code uses torch's defaults. The same comparison
# from the initialization this project used before (embeddings $N(0, 0.02^2)$ as in BERT,
# Glorot-normal matrices, a classifier bias, dropout on the embeddings instead of the attention
# probabilities), at the first depth, with its own step sizes and epoch cap; the same baseline
# gates it.

# %% tags=["hide-input", "remove-stderr"]
if ablation_setup:
    ablation = sentiment.grid(ablation_config, workers=workers)
    both = sentiment.setups_table({setup: grid, ablation_setup: ablation}, layers[0], ablation_methods)
    plots.save_table(both, "table-sentiment-ablation", styled=sentiment.setups_view(both).style.hide(axis="index"))
    glue("ablation-gaps", "; ".join(
        f"{name}: " + sentiment.gaps_text(sentiment.paired_gaps(both[both.setup == name]), per_depth=False)
        for name in (setup, ablation_setup)), display=False)
else:
    plots.save_table(pd.DataFrame({"note": ["no ablation at this profile"]}), "table-sentiment-ablation")
    glue("ablation-gaps", "not measured at this profile", display=False)

# %% [markdown]
# ```{glue:figure} table-sentiment-ablation
# :name: table-sentiment-ablation
#
# The authors' initialization against the earlier one, at the first depth: test accuracy at the stop
# rule or the cap (mean ± std over seeds), the best over epochs, epochs and how many runs reached
# the stop rule. Per run: `_build/results/table-sentiment-ablation.csv`.
# ```
#
# $\ell_{1.1}$ minus GD at the stop rule (or the cap), seed by seed, in points with a paired 95 %
# interval: {glue:text}`ablation-gaps`.
#
# ## How the batches are drawn
#
# Each epoch's random order is cut into pools of a few batches, and each pool is sorted by length
# before it is cut into batches of 100: sentences of similar length share a batch, so little compute
# goes to padding, while a batch's members still change from epoch to epoch. The pool size trades
# the two; the runs use the middle row.

# %% tags=["hide-input"]
lengths = [len(ids) for ids in sentiment.training_subset(sentiment.splits(dataset, 0, max_length)["train"],
                                                         train_size, 0).ids]
pools = pd.DataFrame([{"pool (batches)": pool} | train.batching(lengths, 100, pool) for pool in (1, 4, 8, 16, 64)])
plots.save_table(pools, "table-sentiment-batching", styled=pools.style.format(
    {"padding": "{:.3f}", "again": "{:.1%}", "random_again": "{:.1%}"}).hide(axis="index"))
glue("t1-pool", f"{grid.configs[next(iter(grid.configs))]['fit']['pool']}", display=False)

# %% [markdown]
# ```{glue:figure} table-sentiment-batching
# :name: table-sentiment-batching
#
# Batching at this profile's training set, per pool size: `padding`, the tokens an epoch computes
# over the real ones (1: none wasted); `again`, the share of pairs of sentences that share a batch
# in one epoch and again in the next, against `random_again` for batches drawn at random. The runs
# use pools of {glue:text}`t1-pool` batches.
# ```
#
# ## What we got, next to the paper

# %% tags=["hide-input"]
glue("t1-verdict", scorecard.verdicts("04_sentiment"), display=False)

# %% [markdown]
# This page was computed on {glue:text}`t1-data`. {glue:text}`t1-reached` Table 1 runs reached the
# stop rule. $\ell_{1.1}$ minus GD, seed by seed, in points of test accuracy at the stop rule (or the
# cap) with a paired 95 % t interval: {glue:text}`t1-gaps`; in best test accuracy over epochs, the
# paper's metric: {glue:text}`t1-best-gaps` (the paper: {glue:text}`paper-t1-gaps` at
# {glue:text}`paper-t1-layers` layers).
#
# **The verdict** (the scorecard's rules, applied to the numbers above): {glue:text}`t1-verdict`.
#
# **What this shows.** The authors' model, initialization, loss and step sizes (up to the chosen
# multiple), trained on every training sentence as long as this profile affords, next to a
# bag-of-words baseline, with a paired comparison of the methods. Whether the models reached the
# regime the paper's claim is about reads off two numbers: how many runs reached the stop rule, and
# whether their test accuracy clears the baseline's floor. A run stopped by the epoch cap is not in
# that regime, and the verdict says "not measured" rather than read a difference there. The
# movement figure shows what each optimizer changed. **What it does not show.** The paper's scale:
# 25,000 long IMDb reviews, width 384, 3 / 4 / 6 layers and 10 seeds (the `paper` profile, a GPU).
# Nor is "best test accuracy over epochs", the paper's metric, an unbiased estimate: it selects the
# epoch on the test set, with an upward bias that differs between methods that train for different
# numbers of epochs; we show it for comparison and judge the accuracy at the stop rule.
#
# ## Notes: how the default was sized
#
# The default must run offline on a 2-core CPU within the book's budget (chapters 04-06 in about 40
# minutes). Pilots of the authors' setup on Rotten Tomatoes (3 layers, seed 0, batch 100, two runs
# sharing the 2 cores, length pools of 50 batches; 2026-11-30 and 2026-12-01; training / test accuracy
# at the epochs shown):
#
# | training set, width | method, step (× paper) | epochs | training acc. | test acc. | s / epoch |
# |---|---|---|---|---|---|
# | 1,000, 24 | $\ell_{1.1}$, 3× | 267: stop rule | 0.997 | 0.60 | 1.3 |
# | 1,000, 24 | GD, 10× | 400 (cap) | 0.977 | 0.57 | 1.2 |
# | 8,455, 24 | $\ell_{1.1}$, 3× | 50 / 100; collapsed to chance at 168 | 0.817 / 0.922 | 0.69 / 0.70 | 3.3 |
# | 8,455, 24 | $\ell_{1.1}$, 5× | 50; collapsed to chance at 76 | 0.853 | 0.71 | 3.3 |
# | 8,455, 24 | GD, 10× | 100 / 200 / 300 / 400 (cap; best 0.993) | 0.838 / 0.948 / 0.978 / 0.989 | 0.67 / 0.68 / 0.69 / 0.70 | 3.3 |
# | 8,455, 24 | GD, 30× | 15: at chance | 0.50 | 0.50 | 3.3 |
# | 8,455, 48 | $\ell_{1.1}$, 3× | 50 | 0.898 | 0.68 | 5.1 |
# | 8,455, 48 | GD, 10× | 50 | 0.837 | 0.60 | 4.9 |
#
# The training step itself was made faster first (dropout masks and attention on the CPU, about
# 1.3× per step: `python -m mdlib bench training`). What the pilots say: a thousand sentences reach
# the stop rule but do not generalize (60 % against a 70 % baseline); the whole training split
# generalizes (about 70 % against 77 %) but under the authors' initialization the stop rule is out
# of reach there: GD at 10× its paper step had not reached it after 400 epochs (about 22 minutes a
# run), and $\ell_{1.1}$ at 3× peaked at 0.93 and then collapsed; width 48 fits faster and
# generalizes worse; larger steps diverge. No configuration we tried reaches the stop rule with
# models that generalize within the budget. So the default trains on the whole split at width 24
# with the largest stable multiples, three seeds of $\ell_{1.1}$ and GD and one of $\ell_3$, for
# the epochs the budget affords, and says plainly that its Table 1 is not measured in the regime of
# the paper's claim; the ablation from the modern initialization, which does reach the stop rule,
# gets a verdict of its own.
