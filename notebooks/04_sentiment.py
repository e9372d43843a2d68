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
# **What we run: the authors' setup, one factor changed, and that factor taken apart.** The model
# and the training rule as the authors' public code runs them: token and position embeddings drawn
# $N(0, 1)$, torch's default uniform initialization of every matrix (bound $1/\sqrt{\text{fan in}}$),
# post-LN blocks without biases, dropout 0.2 on the attention probabilities and on both residual
# branches, a classifier without bias on the [CLS] token; binary cross-entropy **summed** over the
# batch of 100 (the paper's step sizes assume the sum); plain mirror descent {eq}`eq-md-update` on
# every parameter; training stops after the first epoch whose running training accuracy (dropout on)
# reaches 99.5 %. Mirror descent is not scale-invariant (by {eq}`eq-md-update`, an entry $w$ moves by
# about $\eta\, g\, |w|^{2-p}/(p-1)$), so these choices decide which layers move and how fast.
#
# On the offline data and a 2-core CPU that setup does not reach the stop rule in the book's budget
# (the notes at the end), and a claim about trained models cannot be judged on models that are not
# trained. So the page runs, in turn: **the replication attempt**, the authors' setup exactly, as long
# as the budget affords, reported with its direction and not judged ("not measured at this scale");
# **the judged variation**, the authors' setup with *one* factor changed: the token and position
# embeddings drawn $N(0, 0.02^2)$ (BERT's scale) instead of $N(0, 1)$, everything else the authors';
# it reaches the stop rule in tens of epochs with models above the generalization floor (below).
# That one factor is not neutral between the methods: with one step size for every parameter,
# $\ell_{1.1}$ gives each tensor an effective step $\eta |w|^{0.9}/0.1$ where GD gives $\eta$, so
# shrinking the embeddings shrinks exactly $\ell_{1.1}$'s embedding step. **The 2 × 2** takes the
# factor apart: $\ell_{1.1}$ with each tensor's step matched to GD's (the geometry of the step, GD's
# initial per-tensor allocation) and GD with $\ell_{1.1}$'s per-tensor steps (the allocation, GD's
# geometry), each arm with a global step of its own chosen like the methods', at two embedding scales.
# **The embedding-scale series** runs the variation at four embedding scales, each with its own steps,
# every run trained to the stop rule, and asks whether the sign of the gap follows the scale. The
# series and the 2 × 2s take a long build (the `overnight` profile, about ten hours of two cores);
# this page reads their runs as that build committed them, and says so where it does. What else differs from
# the paper, and we state it: distinct initializations per seed; training batches of similar lengths
# (below); the data: the default profile runs offline on the Rotten Tomatoes sentences (a source the
# offline machines can reach; all 8,455 training sentences, validation and test splits of 1,056 and
# 1,057) with a narrower model; the `paper` profile runs IMDb at the paper's scale and step sizes.
# Next to all of them: a bag-of-words baseline on the same tokens, which says whether the models
# learned more than word counts.

# %% tags=["parameters"]
profile = "default"  # the params/ profile that produced this page (set by the pipeline)
dataset = "rotten_tomatoes"  # "rotten_tomatoes" (offline) or "imdb" (internet)
max_length = 64  # WordPiece tokens per text, [CLS] and [SEP] included (covers 99.9 % of the sentences)
train_size = None  # training sentences (a seeded, stratified subset; None: the whole training split)
width = 24  # model width (paper: 384); the MLP is 4 x width
layers = [3]  # numbers of layers (and heads) of the rows of Table 1 (paper: [3, 4, 6])
methods = ["1.1", "2", "3"]  # l_p exponents of mirror descent ("2" is GD); "adam" adds Adam as an extra column
setup = "authors"  # the replication's initialization: "authors" (their code), "small-embeddings" or "modern"
seeds = {"1.1": 1, "2": 1, "3": 1}  # replication runs per method, seeds 0..n-1: distinct initializations, data orders and dropout
epochs = 30  # most epochs of a replication run; a run stops at 99.5 % training accuracy
step_multiples = {"1.1": [3], "2": [10], "3": [300]}  # the replication's candidate steps, multiples of the paper's (Adam: of 1e-3); more than one: chosen on validation
variation_setup = "small-embeddings"  # the judged variation's initialization: one factor of the authors' changed
variation_methods = ["1.1", "2"]  # methods of the variation (at the first depth of layers)
variation_seeds = {"1.1": 6, "2": 6}  # the variation's runs per method (l_1.1 and GD paired by seed)
variation_epochs = 100  # most epochs of a variation run
variation_multiples = {"1.1": [0.3333333333333333, 1, 3], "2": [0.3333333333333333, 1, 3]}  # the variation's candidate steps (x paper: 1/3, 1, 3), chosen on validation at the sweep seeds
grow = 2  # times a grid of candidate steps may grow, 3x past the end its choice sits at (variation, series and 2 x 2)
tied_finals = False  # train every seed at each step tied with the variation's choice (the long profile does)
series_stds = []  # embedding stds besides the variation's 0.02 trained here (the series' 0.02 point is the variation); empty: the long profile's committed series and 2 x 2s
series_epochs = [150, 150, 200]  # most epochs at each std of series_stds (in order)
series_multiples = {"1.1": [0.3333333333333333, 1, 3], "2": [0.3333333333333333, 1, 3]}  # the series' candidate steps (x paper) at every std, chosen on validation
allocation_stds = []  # embedding stds of the 2 x 2s trained here (with series_stds: 0.02 or one of them); empty: none trained here
allocation_multiples = [0.3333333333333333, 1, 3]  # candidate multipliers of each 2 x 2 arm's matched steps, chosen on validation
long_committed = True  # with series_stds empty: read the long part as the overnight profile committed it under data/ (True), or show none of it (False: not committed yet)
analysed = "variation"  # the grid whose models chapters 05 and 06 analyse: "variation" or "replication"
workers = 2  # runs trained at once: CPU processes of one thread each, or one process per GPU when several are visible

# %% tags=["remove-stderr"]
import pandas as pd
from IPython.display import Markdown
from myst_nb import glue

from mdlib.book import artifacts, plots, provenance, scorecard
from mdlib.book.views.sentiment import (CONTRAST_NAMES, allocation_runs_view, authors_pilots_view, baseline_view,
                                       contrasts_view, edges_text, effective_steps_view, movement_text,
                                       paper_table1_view, pilots_view, scale_of, series_reading, series_view,
                                       source_text, steps_view, table1_parts, table1_reading, table1_stability,
                                       table1_view, tied_view, timings_text)
from mdlib.experiments.methods import GD, L1_1, key_text
from mdlib.experiments import estimates, paper, sentiment, stats, train
from mdlib.experiments.sentiment import allocation, chapter
from mdlib.models import SMALL_EMBEDDING_STD

plots.set_theme()
glue("paper-table-1", paper_table1_view().style.hide(axis="index").set_table_styles(
    [{"selector": "th, td", "props": "padding: 0.1em 0.7em"}]), display=False)
artifacts.glue_paper()

# %% tags=["remove-stderr"]
configs = dict(zip(sentiment.GRIDS, sentiment.chapter_grids(  # the replication's grid and the variation's
    dataset=dataset, max_length=max_length, train_size=train_size, width=width, setup=setup, epochs=epochs,
    layers=layers, methods=methods, seeds=seeds, step_multiples=step_multiples, variation_setup=variation_setup,
    variation_methods=variation_methods, variation_seeds=variation_seeds, variation_epochs=variation_epochs,
    variation_multiples=variation_multiples, analysed=analysed, grow=grow, tied_finals=tied_finals)))
# the long part: the series (its 0.02 point is the variation) and the 2 x 2s, trained here or read as committed
series, two_by_twos = chapter.long_part(
    configs["variation"], series_stds=series_stds, series_epochs=series_epochs, series_multiples=series_multiples,
    allocation_stds=allocation_stds, allocation_multiples=allocation_multiples, grow=grow, tied_finals=tied_finals)
chapter.train_chapter([*configs.values(), *series], two_by_twos, workers=workers)
recorded = sentiment.grid_name(profile, provenance.notebook_run()["variant"])  # a variant's own, never the book's
grids = {name: sentiment.grid(c, workers=workers, name=recorded if name == analysed else None)
         for name, c in configs.items()}  # the analysed grid is recorded for chapters 05 and 06
runs = sentiment.chapter_runs(grids, analysed)
replication, variation = grids["replication"], grids["variation"]

# %% tags=["remove-stderr"]
long_runs, long_compact, record = chapter.long_tables(variation, series, two_by_twos, read_committed=long_committed,
                                                        workers=workers)
no_long = (f"not measured: {source_text(record, profile)}" if chapter.absent(record)  # what an empty long-part
           else "not measured at this profile")                                            # table says instead
artifacts.save_table(long_runs, "table-sentiment-overnight-runs", glue=False, absent=no_long)  # every run of the series and 2 x 2s
artifacts.save_table(long_compact, "table-sentiment-overnight-predictions", glue=False, absent=no_long)  # their test predictions
long_predictions = chapter.long_predictions(long_compact)
print(f"profile={profile}: {dataset}, width {width}; the long part "
      + ("trained here" if series else "none" if chapter.absent(record) else "as committed"))
text = {key: key_text(key) for key in dict.fromkeys(methods + variation_methods)}

# %% tags=["hide-input"]
predictions = pd.concat([sentiment.predictions(g.configs, g.results).assign(grid=name) for name, g in grids.items()],
                        ignore_index=True)
artifacts.save_table(predictions, "table-sentiment-predictions", glue=False)  # per run and test sentence: correct or not
of_grid = {name: predictions[predictions.grid == name] for name in ("replication", "variation")}

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
floor = stats.generalization_floor(nb)
artifacts.save_table(baseline, "table-sentiment-baseline", styled=baseline_view(baseline).style.hide(axis="index"))
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
# One rule for every method and arm of this chapter (`step_grid.tie_choice`), applied by each grid's
# sweep: the candidates are multiples 1/3, 1 and 3 of the paper's step for that method (of the matched
# steps for an arm of the 2 × 2), spaced 3× apart; each is trained at seeds 0 and 1
# (`sentiment.SWEEP_SEEDS`). A candidate whose runs all reached the stop rule ranks before one that
# missed it at either seed, and one that overflowed at either seed is never chosen. Among the rest,
# every candidate whose mean validation accuracy lies within 1.96 standard errors of the best one's
# ties with it, the error being the *paired* one: the difference of the two candidates on the same
# validation sentences at the same seeds, over both samples (`stats.crossed_interval` on the
# per-sentence predictions). Of the tied candidates the middle one is chosen, and of two the one with
# the higher validation accuracy: a rule that favours neither small nor large steps (a test holds that
# with equally good candidates it picks either end equally often, and that two builds on different
# run noise agree on it more often than on the best score). A choice at an end of its grid grows the
# grid by one candidate 3× beyond that end, and the sweep and the choice run again, at most
# {glue:text}`t1-grow` times a side. The test split plays no part. The sweep's runs at the chosen step
# are that cell's seeds 0 and 1; the remaining seeds train at the chosen step (and, in the long
# profile, at every tied step too, so that a verdict can be read at each). A later run that overflows
# is recorded as such (it counts as a run that missed the stop rule) instead of stopping the book. The
# replication keeps one candidate per method, the multiples its pilots found stable (it is not judged).
# Where each chosen step sits in its grid: {glue:text}`t1-edges`; in the long part (the series and the
# 2 × 2s): {glue:text}`t1-long-edges`. Saved as
# `_build/results/table-sentiment-steps.csv`.

# %% tags=["hide-input"]
steps = runs[runs.seed < sentiment.SWEEP_SEEDS]
artifacts.save_table(steps, "table-sentiment-steps", styled=steps_view(steps).style.hide(axis="index"))
glue("t1-edges", "; ".join(f"{name}: {edges_text(part, configs[name].multiples, configs[name].grow) or 'inside its grid for every method'}"
                           for name, part in runs.groupby("grid", sort=False)), display=False)
glue("t1-long-edges", (edges_text(long_runs, {**series_multiples, **{arm: list(allocation_multiples) for arm in allocation.ARMS}},
                                  grow, by=("part", "embedding_std")) or "inside its grid for every method and arm")
     if len(long_runs) else no_long, display=False)
glue("t1-grow", f"{grow}", display=False)
glue("t1-timings", timings_text(long_runs, runs, workers), display=False)

# %% [markdown]
# ```{glue:figure} table-sentiment-steps
# :name: table-sentiment-steps
#
# The candidate step sizes of both grids at the sweep seeds (0 and 1): epochs to the stop rule (or
# the cap), the training accuracy of the last epoch, the validation accuracy at the end, the chosen
# multiple (✓) and those tied with it.
# ```
#
# ## Table 1, the judged variation: small embeddings

# %% tags=["hide-input"]
artifacts.save_table(runs, "table-sentiment-runs", glue=False)


def glue_table1(grid, name: str, label: str, prefix: str) -> None:
    """Save a grid's Table 1 under ``label`` and glue its numbers under ``prefix``-..."""
    cells = sentiment.cell_table(grid.runs, grid.config.setup)
    artifacts.save_table(cells, label, styled=table1_view(cells, nb).style.hide(axis="index"))
    chosen = grid.runs[grid.runs.chosen]
    glue(f"{prefix}-reached", f"{int(chosen.reached.sum())} of {len(chosen)}", display=False)
    glue(f"{prefix}-data", f"{dataset}, {train_size or 'all'} training texts, width {width}, setup "
         f"{paper.SETUP_NAMES[grid.config.setup]}, seeds "
         + ", ".join(f"{text[k]} {sentiment.seeds_of(grid.config, k)}" for k in grid.config.methods)
         + f", at most {grid.config.epochs} epochs", display=False)
    gaps = estimates.accuracy_gaps(grid.runs, predictions=of_grid[name])
    glue(f"{prefix}-gaps", "; ".join(f"{g.both_text()} ({g.n} pairs) at {L} layers" for L, g in gaps.items()),
         display=False)
    glue(f"{prefix}-best-gaps", estimates.depths_text(estimates.accuracy_gaps(grid.runs, "best_test")), display=False)


glue_table1(variation, "variation", "table-1-variation", "t1v")

# %% [markdown]
# ```{glue:figure} table-1-variation
# :name: table-1-variation
#
# Table 1 from the authors' setup with one factor changed (token and position embeddings
# $N(0, 0.02^2)$). Test accuracy (%) at the stop rule, or at the epoch cap for a run that did not
# reach it (mean ± standard deviation over seeds); the best test accuracy over epochs, the paper's
# metric, which selects the epoch on the test set; the mean number of epochs and how many runs
# reached the stop rule; the paper's IMDb numbers and the authors' epochs to the stop. Last row: the
# bag-of-words baseline on the same data. Per run: `_build/results/table-sentiment-runs.csv`
# (`grid` = variation).
# ```
#
# Computed on {glue:text}`t1v-data`. {glue:text}`t1v-reached` runs reached the stop rule.
# $\ell_{1.1}$ minus GD, seed by seed (a seed gives both the same initialization, data order and
# dropout stream), in points of test accuracy at the stop rule: {glue:text}`t1v-gaps`. The first
# interval counts both samples behind the number, the seeds and the 1,057 test sentences (a sample of
# the reviews the claim is about; `stats.crossed_interval`: the seeds' variance of the mean plus the
# sentences', from every model's prediction on every test sentence,
# `_build/results/table-sentiment-predictions.csv`); the second, the paired t interval over seeds
# alone, treats the test sentences as fixed. In best test accuracy over epochs, the paper's metric:
# {glue:text}`t1v-best-gaps` (the paper, in the authors' setup on IMDb: {glue:text}`paper-t1-gaps` at
# {glue:text}`paper-t1-layers` layers). The scorecard judges the first interval; its verdict (at the
# end of the chapter) also gives the smallest gap the design can detect.
#
# **At every tied pair of steps.** Where the validation cannot tell a method's candidates apart, the
# choice among them is the tie rule's, not the data's, and a verdict that another tied choice would
# turn is not settled. The long build trains every seed at every step tied with each method's choice
# (`tied_finals`) of this same variation ({glue:text}`t1v-tied-source`); ℓ1.1 − GD at each pair of
# tied steps, over its seeds and the test sentences:

# %% tags=["hide-input"]
SMALL = SMALL_EMBEDDING_STD
same = chapter.same_variation(record, configs["variation"])  # the long build's variation is this one
tied = chapter.tied_at(long_runs, long_predictions, SMALL, "gap") if same else pd.DataFrame()
why_not = ("no long part in this build" if chapter.absent(record) else "the long build ran another variation")
artifacts.save_table(tied, "table-sentiment-tied", absent=f"not measured at this profile: {why_not}",
                     styled=tied_view(tied, estimates.CONTRASTS["gap"]).style.hide(axis="index") if len(tied) else None)
glue("t1v-tied-source", ("trained by this execution" if record is None else "read from its committed runs")
     if same else f"not measured at this profile: {why_not}", display=False)

# %% [markdown]
# ```{glue:figure} table-sentiment-tied
# :name: table-sentiment-tied
#
# The variation's ℓ1.1 − GD at every pair of steps tied with the choices (the long build's runs of
# every seed at each tied step), in points of test accuracy at the stop rule. Values:
# `_build/results/table-sentiment-tied.csv`.
# ```
#
# The scorecard's verdict on the variation says whether it holds at every one of these pairs; where
# it does not, the verdict is marked not settled.

# %% tags=["hide-input"]
artifacts.save_figure(plots.training_curves(variation.history, variation_methods), "fig-sentiment-curves-variation",
                  data=variation.history)

# %% [markdown]
# ```{glue:figure} fig-sentiment-curves-variation
# :name: fig-sentiment-curves-variation
#
# The judged variation's training. Above: test accuracy against epoch (solid: mean over seeds while
# all of them run, band: ± one standard deviation) and the running training accuracy (dotted, mean;
# ticks: where each run stopped; grey line: the 99.5 % stop rule). Below: the training loss per
# example (dropout on, log scale). Every run and epoch:
# `_build/results/fig-sentiment-curves-variation.csv`.
# ```
#
# ## Geometry or step allocation: the 2 × 2
#
# With one step size $\eta$ for every parameter, GD moves every entry by about $\eta |g|$, while
# $\ell_{1.1}$ moves an entry $w$ by about $\eta |g| |w|^{0.9}/0.1$: a step per tensor that follows
# its initial scale. The first table gives this first-order *effective step*, averaged over each
# group's entries at initialization, in both setups, with its ratio to GD's. It shows what the
# variation changed besides the embeddings' scale: in the authors' setup $\ell_{1.1}$ moves the
# embeddings much faster than GD, in the variation much slower. So the variation's gap may come from
# the geometry of the $\ell_{1.1}$ step (the max-margin bias the paper is about) or from how large a
# step each tensor starts with. Two more arms take the two apart (`allocation.ARMS`,
# `mdlib.matched_param_groups`):
#
# - **$\ell_{1.1}$ at GD's steps per tensor**: each tensor's step is matched, at its mean $|w|$ at
#   initialization, to GD's chosen step (`matched_lr`), so that every tensor starts moving as far as
#   under GD: what is left against GD is the geometry;
# - **GD at $\ell_{1.1}$'s steps per tensor**: each tensor gets the step $\ell_{1.1}$'s chosen step
#   gives it, so that GD starts moving every tensor as far as $\ell_{1.1}$ does: what is left against
#   GD is the initial per-tensor allocation.
#
# Each arm then takes a global multiplier of its matched steps (1/3, 1 or 3, growing past an end),
# chosen on validation by the rule above, so that no arm is judged at a step nobody searched. No
# tensor of this model starts at zero (the authors' layers have no biases, the LayerNorm gains start
# at 1), so every tensor has a matched step (at zero none exists, `matched_lr`).

# %% tags=["hide-input"]
L = variation.config.layers[0]
at_steps = {(paper.SETUP_NAMES[g.config.setup], key): g.configs[L, key, 0]
            for g in (replication, variation) for key in (L1_1, GD) if (L, key, 0) in g.configs}
effective = allocation.step_table(at_steps)
artifacts.save_table(effective, "table-sentiment-effective-steps", styled=effective_steps_view(effective).style.hide(
    axis="index").set_table_styles([{"selector": "th, td", "props": "padding: 0.1em 0.35em"}]))

# %% [markdown]
# ```{glue:figure} table-sentiment-effective-steps
# :name: table-sentiment-effective-steps
#
# The first-order effective step of each parameter group at initialization, the mean over its
# entries of $\eta_t |w|^{2-p}/(p-1)$ ($\eta_t$: the step of the entry's tensor), for each method at
# its chosen step in each setup (seed 0); in brackets, its ratio to GD's in the same setup.
# Embeddings: the token and position tables; attention: the query/key/value and output maps; norms:
# the LayerNorm gains. Values: `_build/results/table-sentiment-effective-steps.csv`.
# ```
#
# The 2 × 2 runs at {glue:text}`t1a-stds`: the long build runs it at the variation's 0.02, where GD
# starts moving the embeddings faster, and at a scale on the series' other side, where $\ell_{1.1}$
# does. It is part of the long build ({glue:text}`t1a-source`).

# %% tags=["hide-input"]
two_stds = sorted(set(long_runs[long_runs.part == "2x2"].embedding_std.astype(float)))
chosen_2x2 = {std: chapter.two_by_two(long_runs, long_predictions, std) for std in two_stds}
effects = {std: estimates.allocation_effects(part, predicted) for std, (part, predicted) in chosen_2x2.items()}
two_runs = pd.concat([part for part, _ in chosen_2x2.values()], ignore_index=True) if chosen_2x2 else long_runs.iloc[:0]
artifacts.save_table(two_runs, "table-sentiment-allocation", absent=no_long,
                     styled=allocation_runs_view(two_runs).style.hide(axis="index") if len(two_runs) else None)
artifacts.save_table(allocation.contrasts_table(effects), "table-sentiment-contrasts", absent=no_long,
                     styled=contrasts_view(effects, CONTRAST_NAMES).style.hide(axis="index"))
tied_2x2 = pd.concat([chapter.tied_at(long_runs, long_predictions, std, name, least=3) for std in two_stds
                      for name in ("geometry", "allocation")] or [pd.DataFrame()], ignore_index=True)
artifacts.save_table(tied_2x2 if len(tied_2x2) else pd.DataFrame({"note": ["no tied combination of steps with every seed"]}),
                     "table-sentiment-tied-2x2", glue=False)  # each judged contrast at every tied combination
glue("t1a-stds", " and ".join(f"σ {std:g}" for std in two_stds) or "not run", display=False)
glue("t1a-source", source_text(record, profile), display=False)
glue("t1a-judged", "; ".join(f"at σ {std:g}, the geometry {named['geometry'].text()} and the allocation "
                             f"{named['allocation'].text()} points" for std, named in effects.items())
     or "not measured", display=False)
glue("t1a-power", "; ".join(f"at σ {std:g}, for the geometry {estimates.power_text(named['geometry'])}; for the "
                            f"allocation {estimates.power_text(named['allocation'])}" for std, named in effects.items())
     or "not measured", display=False)

# %% [markdown]
# ```{glue:figure} table-sentiment-allocation
# :name: table-sentiment-allocation
#
# The 2 × 2 at each embedding scale: $\ell_{1.1}$ and GD at their chosen global steps, and the two
# arms at their chosen multiplier of the matched steps. Test accuracy at the stop rule and best over
# epochs (mean ± standard deviation over seeds), epochs and how many runs reached the stop rule,
# validation accuracy. Every run, the arms' sweeps included: `_build/results/table-sentiment-overnight-runs.csv`.
# ```
#
# ```{glue:figure} table-sentiment-contrasts
# :name: table-sentiment-contrasts
#
# The 2 × 2's contrasts at each scale, seed by seed, in points of test accuracy at the stop rule, over
# seeds and test sentences (seeds only in brackets): the gap at one global step each; the geometry's
# two simple effects (at GD's initial per-tensor allocation, and at $\ell_{1.1}$'s); the allocation's two
# (at GD's geometry, and at $\ell_{1.1}$'s); and the interaction, the geometry's effect at
# $\ell_{1.1}$'s allocation minus at GD's. Values: `_build/results/table-sentiment-contrasts.csv`.
# ```
#
# The scorecard judges the geometry at GD's allocation and the allocation at GD's geometry, against
# zero, at each scale (below): {glue:text}`t1a-judged`. **Power**, against the ±0.9 points the 2 × 2 was asked to resolve:
# {glue:text}`t1a-power`.
#
# ## The embedding scale: does the sign of the gap follow it?
#
# The variation changed the embeddings' standard deviation from the authors' 1 to 0.02. The series
# runs the variation at embedding stds {glue:text}`t1s-stds`, $\ell_{1.1}$ and GD, each scale with its
# own steps chosen on validation by the rule above (candidates 1/3, 1 and 3 times the paper's steps,
# growing past an end) and {glue:text}`t1s-seeds` seeds per method, each run to the stop rule within
# its epoch cap. To first order the two methods' embedding steps are equal where
# $\eta_{1.1} E|w|^{0.9}/0.1 = \eta_{GD}$: at the paper's steps that is $\sigma \approx$
# {glue:text}`t1s-equal`, but each scale has its own chosen steps, so the figure plots the gap against
# the ratio of the two embedding steps at those steps as well, the quantity the mechanism acts on. A
# scale whose chosen runs did not all reach the stop rule is not a point of the claim: it stands apart
# and is not judged. The inference is at the level the design randomizes, the std: its step choice is
# shared by its seed pairs, so the slope takes the stds, not the pairs, as units. The series is part
# of the long build ({glue:text}`t1s-source`).

# %% tags=["hide-input"]
points = chapter.series_points(long_runs, long_predictions)
equal = allocation.equal_step_std(sentiment.reference_step(L, L1_1), sentiment.reference_step(L, GD))
if len(points):
    artifacts.save_figure(plots.scale_series_figure(points, SMALL), "fig-sentiment-scale-series", data=points)
else:  # the caption stands over the reason instead of a figure
    glue("fig-sentiment-scale-series", Markdown(no_long), display=False)
artifacts.save_table(points, "table-sentiment-series", styled=series_view(points).style.hide(axis="index"),
                     absent=no_long)
trend = estimates.scale_trend(points)
against_ratio = estimates.scale_trend(points, x="embedding_ratio")
glue("t1s-stds", ", ".join(f"{x:g}" for x in points.embedding_std) or "none in this build", display=False)
glue("t1s-seeds", f"{int(points.n.max())}" if len(points) else "the variation's number of", display=False)
glue("t1s-equal", f"{equal:.3f}", display=False)
glue("t1s-source", source_text(record, profile), display=False)
glue("t1s-reading", series_reading(points, trend, against_ratio), display=False)

# %% [markdown]
# ```{glue:figure} fig-sentiment-scale-series
# :name: fig-sentiment-scale-series
#
# The embedding-scale series: $\ell_{1.1}$ minus GD in test accuracy at the stop rule at each scale's
# chosen steps, with its 95 % interval over the seed pairs and the test sentences, against the
# embedding std (left) and against the ratio of $\ell_{1.1}$'s first-order embedding step to GD's at
# those steps (right). Filled points: every chosen run reached the stop rule (joined on the left; on the
# right each is named by its std); open points: a run stopped at the epoch cap, apart. The points:
# `_build/results/fig-sentiment-scale-series.csv`.
# ```
#
# ```{glue:figure} table-sentiment-series
# :name: table-sentiment-series
#
# The series per embedding std: each method's chosen multiple of the paper's step and the multiples
# tied with it, the ratio of the two first-order embedding steps at the chosen steps, how many of the
# chosen runs reached the stop rule, and $\ell_{1.1}$ − GD with its interval over seeds and sentences
# (seeds only in brackets). Values: `_build/results/table-sentiment-series.csv`.
# ```
#
# **What the series shows**: {glue:text}`t1s-reading`.
#
# ## Table 1, the replication attempt: the authors' setup

# %% tags=["hide-input"]
glue_table1(replication, "replication", "table-1", "t1")

# %% [markdown]
# ```{glue:figure} table-1
# :name: table-1
#
# The paper's Table 1 in the authors' setup, as far as this profile trains it (columns as above).
# Per run: `_build/results/table-sentiment-runs.csv` (`grid` = replication).
# ```
#
# Computed on {glue:text}`t1-data`. {glue:text}`t1-reached` runs reached the stop rule: a run stopped
# by the epoch cap is not in the regime the claim is about, so the scorecard reads this grid "not
# measured at this scale" and shows only its direction. $\ell_{1.1}$ minus GD at the cap, seed by
# seed: {glue:text}`t1-gaps`; best over epochs: {glue:text}`t1-best-gaps`.

# %% tags=["hide-input"]
artifacts.save_figure(plots.training_curves(replication.history, methods), "fig-sentiment-curves",
                  data=replication.history)

# %% [markdown]
# ```{glue:figure} fig-sentiment-curves
# :name: fig-sentiment-curves
#
# The replication's training, drawn as above. Every run and epoch:
# `_build/results/fig-sentiment-curves.csv`.
# ```
#
# ## Why the setups differ: what each method moves
#
# Mirror descent with $p$ near 1 moves an entry $w$ about $|w|^{0.9}/0.1$ times as far as GD at the
# same step. Under the authors' initialization the embedding tables are drawn $N(0, 1)$, far larger
# than the matrices ($|w| \le 1/\sqrt{\text{width}}$), so $\ell_{1.1}$ should move the embeddings
# much further than GD does, and the comparison may measure which optimizer moves the embeddings as
# much as anything else; with embeddings $N(0, 0.02^2)$ the tables are smaller than the matrices and
# the balance turns. The relative movement $\lVert W - W(0) \rVert / \lVert W(0) \rVert$ of each
# part of each trained model, against its own initialization, shows it in both grids.

# %% tags=["hide-input"]
moved = {}
for name, grid in grids.items():
    moved[name] = sentiment.movement(grid)
    label = "fig-sentiment-movement" + ("" if name == "replication" else f"-{name}")
    artifacts.save_figure(plots.movement_bars(moved[name], grid.config.methods), label, data=moved[name])
glue("t1-moved", movement_text(moved["replication"], text), display=False)
glue("t1v-moved", movement_text(moved["variation"], text), display=False)

# %% [markdown]
# ```{glue:figure} fig-sentiment-movement
# :name: fig-sentiment-movement
#
# The replication (the authors' setup): relative movement
# $\lVert W - W(0) \rVert_F / \lVert W(0) \rVert_F$ per group of parameters (embeddings: token and
# position tables; attention: query/key/value and output maps; MLP; the LayerNorm gains; the
# classifier), at the end of each chosen run: mean over seeds with a 95 % t interval (none for a
# single seed), log scale. Per run: `_build/results/fig-sentiment-movement.csv`.
# ```
#
# ```{glue:figure} fig-sentiment-movement-variation
# :name: fig-sentiment-movement-variation
#
# The judged variation (small embeddings), drawn the same way. Per run:
# `_build/results/fig-sentiment-movement-variation.csv`.
# ```
#
# Mean relative movement, replication: {glue:text}`t1-moved`. Variation: {glue:text}`t1v-moved`.
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
artifacts.save_table(pools, "table-sentiment-batching", styled=pools.style.format(
    {"padding": "{:.3f}", "again": "{:.1%}", "random_again": "{:.1%}"}).hide(axis="index"))
glue("t1-pool", f"{replication.configs[next(iter(replication.configs))].fit.pool}", display=False)

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
judged = scorecard.chapter_rows("04_sentiment")
glue("t1-verdict", scorecard.verdicts_text(judged), display=False)
for name, rows in table1_parts(judged).items():
    glue(f"t1-said-{name}", "; ".join((f"at {scale_of(row)}, " if len(rows) > 1 else "") + scorecard.said(row)
                                      for row in rows) or "not measured at this profile", display=False)
glue("t1-reading", table1_reading(judged), display=False)
glue("t1-stability", table1_stability(judged), display=False)

# %% tags=["hide-input"]
glue("t1-power", estimates.power_text(estimates.accuracy_gaps(variation.runs, predictions=of_grid["variation"])[L]),
     display=False)

# %% [markdown]
# **The verdicts** (the scorecard's rules, applied to the numbers above): {glue:text}`t1-verdict`.
#
# **What this shows.** Four questions, each judged by the scorecard with its interval over seeds and
# test sentences, its smallest detectable effect and how stable it is (the probability that an
# independent rebuild reaches the same verdict). (1) In the variation, the authors' setup with its
# embeddings drawn $N(0, 0.02^2)$, trained to the paper's stop rule with step sizes chosen alike on
# validation: does $\ell_{1.1}$ reach a higher test accuracy than GD, and does the answer hold at every
# pair of steps the validation cannot tell apart? This is a verdict on the variation, in which
# $\ell_{1.1}$'s first-order embedding step is a fraction of GD's (the effective-step table), not on
# the paper's setup, in which it is several times GD's; the paper's gap ({glue:text}`paper-t1-gaps`
# points, IMDb) is drawn beside it as the authors' setup's number, not as the same claim. (2) and (3)
# The 2 × 2 at two scales: with each tensor's first step matched to GD's, is $\ell_{1.1}$ behind or
# ahead (the geometry), and does GD with $\ell_{1.1}$'s per-tensor steps move away from GD (the initial
# allocation)? (4) The series: does the gap move with the embeddings' scale, and does its sign
# change? Next to them, the authors' setup exactly, with its direction, and a bag-of-words baseline
# that says the models generalize: the variation's models recover most of the Naive Bayes margin over
# chance, above the floor, yet stay below Naive Bayes itself (the table's last row), so they are weak
# sentiment models, and the verdicts are about them. The movement figures show what each optimizer
# changed in each setup.
#
# **What it does not show.** The paper's scale: 25,000 long IMDb reviews, width 384, 3 / 4 / 6 layers
# and 10 seeds, and the authors' setup at the stop rule there (the `paper` profile, a GPU): that is
# where the paper's claim lives, and none of this page's verdicts is about it. The effective steps are
# first-order and at initialization: they say how each method starts moving each tensor, not how far
# it moves it by the end (the movement figures). Nor is "best test accuracy over epochs", the paper's
# metric, an unbiased estimate: it selects the epoch on the test set, with an upward bias that differs
# between methods that train for different numbers of epochs; we show it for comparison and judge the
# accuracy at the stop rule. **Power**: {glue:text}`t1-power`.
#
# **What a reader may conclude about Table 1.** In the variation the scorecard reads $\ell_{1.1}$
# against GD as **{glue:text}`t1-said-variation`**; but the variation hands $\ell_{1.1}$ a fraction
# of GD's embedding step, so that verdict alone cannot be read against the paper. With each tensor's
# first step matched to GD's, so that only the geometry of the step differs, $\ell_{1.1}$ against GD
# reads **{glue:text}`t1-said-geometry`**; GD given $\ell_{1.1}$'s initial per-tensor steps against
# GD, the allocation alone, reads **{glue:text}`t1-said-allocation`**. {glue:text}`t1-reading` Across
# scales the scorecard reads the series as **{glue:text}`t1-said-series`**: {glue:text}`t1s-reading`.
# The paper fixes the scale without discussing it: the authors' code draws the tables $N(0, 1)$, the
# setup the replication below follows, at which $\ell_{1.1}$'s embedding step is several times GD's.
# What remains open is the paper's own setting: the authors' setup at IMDb's scale, trained to the
# stop rule, which this CPU cannot reach and the `paper` profile runs on a GPU. Nothing here says the
# paper's numbers are wrong there; it says which of them carry over to this model and data, and why.
#
# ## Notes: how the default was sized
#
# The default must run offline on a 2-core CPU within the book's budget. Pilots of the authors'
# setup on Rotten Tomatoes (3 layers, seed 0, batch 100, two runs sharing the 2 cores, length pools;
# 2026-11-30 and 2026-12-01; `data/sentiment_authors_pilots.csv`):

# %% tags=["hide-input"]
glue("table-sentiment-authors-pilots", authors_pilots_view(sentiment.authors_pilots()).style.hide(axis="index"),
     display=False)

# %% [markdown]
# ```{glue:figure} table-sentiment-authors-pilots
# :name: table-sentiment-authors-pilots
#
# Pilots of the authors' setup (measured once, on one machine; not recomputed by this page): training
# and test accuracy at the epochs shown, and how each run ended (the stop rule, the epoch cap, a
# collapse to chance, or not run further), seconds an epoch with two runs sharing the cores.
# ```
#
# A thousand sentences reach the stop rule but do not generalize (60 % against a 70 % baseline); the
# whole training split generalizes (about 70 % against 77 %) but under the authors' initialization
# the stop rule is out of reach there: GD at 10× its paper step had not reached it after 400 epochs
# (about 22 minutes a run), and $\ell_{1.1}$ at 3× peaked at 0.93 and then collapsed; larger steps
# diverge. Making the step faster does not buy it (the step is per-element work; a vectorized
# ensemble of seeds measured 1.05-1.4× per model). The movement of the replication's models pointed
# at the embeddings' scale: under $N(0, 1)$ tables $\ell_{1.1}$ moves the embeddings several times as
# far as GD. So we piloted the single-factor change first, the authors' setup with embeddings
# $N(0, 0.02^2)$ (all 8,455 sentences, width 24, 3 layers, two runs sharing the cores, 2026-12-02;
# `data/sentiment_pilots.csv`):

# %% tags=["hide-input"]
pilots = sentiment.pilots()
glue("table-sentiment-pilots", pilots_view(pilots).style.hide(axis="index"), display=False)

# %% [markdown]
# ```{glue:figure} table-sentiment-pilots
# :name: table-sentiment-pilots
#
# Pilots of the single-factor variation (measured once, on one machine; not recomputed by this
# page): epochs to the stop rule (or the cap), training accuracy of the last epoch, test and
# validation accuracy at the end, seconds an epoch with two runs sharing the cores.
# ```
#
# It reaches the stop rule in tens of epochs, above the floor, for both methods: the judged
# variation. The rows at seeds 1-11 come from a first default build that had chosen $\ell_{1.1}$ at
# 3× on seed 0 alone; 4 more of its runs (seeds 3, 5, 8 and 11) overflowed and are not listed. (The
# fully "modern" initialization, Glorot matrices and a classifier bias besides, reached it too, in
# 57-103 epochs, but changes three factors.) The replication keeps the authors' setup at the largest
# stable multiples for the epochs left in the budget.
#
# **The 2 × 2, piloted** (the last rows, 2026-12-05; GD at its paper step): $\ell_{1.1}$ at GD's steps
# per tensor reached the stop rule in 49 and 54 epochs at 72.9 and 73.1 % test (seeds 0 and 1), below
# $\ell_{1.1}$ at its global step (74.8 and 74.5 %) and GD (77.6 and 75.8 %); GD at $\ell_{1.1}$'s steps
# per tensor in 45 epochs at 77.2 and 74.3 %, close to GD. They showed that both arms reach the stop
# rule within the variation's epochs.
#
# **What the budget holds, and what it does not.** The book's budget is 75 minutes on two idle cores.
# Searching three steps for every method (and growing a grid past an end) costs the variation what the
# variation and a 2 × 2 at fixed steps cost before, so the default trains the variation (6 seeds, its
# sweep at seeds 0 and 1) and the replication (one seed per method, 30 epochs: direction only, not
# judged), and reads the long part as the `overnight` profile measured it: the series at four
# embedding stds, each with its own tuned steps and 6 seeds, every run to the stop rule within a cap
# of 100 to 200 epochs; the 2 × 2 at two stds, each arm's multiplier tuned; and every seed at every step
# tied with the variation's choices ({glue:text}`t1s-source`). $\ell_3$ is left out of the variation
# (no verdict reads it). At 6 seeds the seeds-only interval of $\ell_{1.1}$ − GD is ±2.57 σ/√6 =
# ±1.05 σ: ±1.0 point at the first machine's paired σ of 0.95, ±1.8 at the 1.70 a second machine
# measured; the interval over seeds and sentences adds the test set's part, which no number of seeds
# removes (the power lines above give both for this build). How stable each verdict is: the
# probability that an independent rebuild (the same sentences, new run noise, every step chosen again
# on new sweep runs) reaches it is, in this build, {glue:text}`t1-stability`; below 0.80 a verdict is
# marked fragile. It is predicted by simulating the whole procedure from this build's runs
# (`mdlib.experiments.stability`), and a test checks the prediction against simulated rebuilds over a
# range of effects (within 5 points, in bins of the prediction). Where an arm's matched steps follow a
# step that another choice could move, the probability is a lower bound: a rebuild that picks the other
# step counts as a change. An earlier measure, the share of 200 bootstrap resamples of the seeds, was
# not calibrated (a resample that repeats a seed inflates the sentences' part of the interval, and it
# held the step choice) and is replaced. Their training, timed:
# {glue:text}`t1-timings`.
