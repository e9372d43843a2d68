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
# # What a mirror-descent step costs (E8)
#
# **The claim.** An $\ell_p$ mirror-descent step {eq}`eq-md-update` needs no inner problem: per
# parameter it is a few elementwise operations more than a gradient step. The paper counts about
# {glue:text}`paper-ops`, and reports {glue:text}`paper-hours` of its vision transformer on one V100,
# with small differences between the five optimizers {cite}`julistiono2026mirror`.
#
# **What we measure.** Operation counts say little about wall time: an optimizer step streams every
# parameter, gradient and state tensor through memory, and transcendental functions cost more than
# multiplications. We time (1) one optimizer step against the number of parameters, for
# `mdlib.optim.LpMirrorDescent` at each $p$ next to torch's SGD and Adam, each in its default
# implementation (on a CPU a loop over the tensors, on a GPU torch's multi-tensor "foreach" kernels) and
# fused (torch's fused kernels; for mirror descent, the update compiled by `torch.compile`); (2) one
# training step of the models of chapters 04 and 07 at this book's default sizes, with the optimizers
# as those chapters build them; (3) one training step of the paper's vision transformer, from which we
# extrapolate the time of the paper's 2000 epochs. Every contender takes its first steps untimed: the
# first fused mirror-descent step compiles its kernel, which takes seconds to a minute.

# %% tags=["parameters"]
profile = "default"  # the params/ profile that produced this page (set by the pipeline)
sizes = [100000, 300000, 1000000, 3000000, 10000000]  # numbers of float32 parameters to time a step on
ps = [1.1, 1.75, 2.0, 3.0]  # exponents of mirror descent
modes = ["default", "fused"]  # LpMirrorDescent implementations: "default" (CPU: single-tensor), "foreach", "fused" (torch.compile)
repeats = 21  # timed steps per contender and size (interleaved), reported as medians
training_repeats = 21  # timed training steps per optimizer for the chapters' models (interleaved)
vit = "paper"  # vision transformer to time: "paper" (CIFAR, 48 px, width 512, depth 6) or "tiny"
vit_batch = 100  # batch size of the timed training step (the paper's)
vit_repeats = 2  # timed training steps per optimizer

# %%
import logging

import torch
from myst_nb import glue

from mdlib.book import artifacts, plots, provenance
from mdlib.experiments import cost

cost.choice("vit", vit, cost.VIT_MODELS)  # before any timing: any other value would time the tiny model
for mode in modes:
    cost.choice("modes", mode, cost.MD_MODES)
plots.set_theme()
artifacts.glue_paper()

# %%
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # "no CUDA runtime" on CPU machines
device = "cuda" if torch.cuda.is_available() else "cpu"
machine = provenance.hardware()
hardware = machine["gpu"] if device == "cuda" else f"{machine['cpu']}, {machine['cpu_count']} cores"
glue("cost-hardware", hardware, display=False)
glue("cost-torch", f"torch {torch.__version__}, {torch.get_num_threads()} threads", display=False)
print(f"profile={profile}: {hardware}; torch {torch.__version__}, {torch.get_num_threads()} threads")

# %% tags=["hide-input"]
steps, targets = cost.step_tables(sizes, ps, repeats=repeats, modes=modes)

# %% tags=["hide-input"]
fig = plots.cost_step_figure(steps)
artifacts.save_figure(fig, "fig-cost-step", data=steps)

# %% [markdown]
# ```{glue:figure} fig-cost-step
# :name: fig-cost-step
#
# Left: median time of one optimizer step against the number of float32 parameters (the
# parameters are split into tensors of a typical model's mix of sizes). Right: the same as a ratio to
# fused Adam, measured round by round. Solid: fused; dashed: the default implementation (on a CPU, a
# loop over the tensors); dotted: foreach. Mirror descent at $p = 2$ is SGD.
# Numbers: `_build/results/fig-cost-step.csv`.
# ```

# %% tags=["hide-input"]
training = cost.training_table(repeats=training_repeats)
artifacts.save_table(training, "table-cost-training", styled=training.style.format(
    {"ms per step": "{:.1f}", "vs Adam (median ratio)": "{:.3f}"}).hide(axis="index"))
md_training = training[training.method != "adam"]["vs Adam (median ratio)"]
glue("cost-train-ratio", f"{md_training.min():.2f} to {md_training.max():.2f}", display=False)
glue("cost-train-verdict", "within" if md_training.max() <= cost.TRAINING_TARGET else "not within", display=False)

# %% tags=["hide-input"]
timing = cost.vit_table(vit, vit_batch, vit_repeats, ps, device)
table = cost.ops_table(steps, ps, modes)
artifacts.save_table(table, "table-cost", styled=table.style.format({"ns per param (step, largest size)": "{:.2f}"})
                 .hide(axis="index"))
artifacts.save_table(timing, "table-cost-vit", styled=timing.style.format(
    {"step_s": "{:.3f}", "hours_2000_epochs": "{:,.0f}", "params": "{:,}"}).hide(axis="index"))

# %% tags=["hide-input"]
glue("cost-vit-params", f"{int(timing.params.iloc[0]):,}", display=False)
glue("cost-vit-spread", float(timing.step_s.max() / timing.step_s.min()), display=False)
glue("cost-vit-hours-adam", float(timing.hours_2000_epochs.iloc[0]), display=False)
glue("cost-largest", f"{int(steps.params.max()):,}", display=False)
largest = steps[steps.params == steps.params.max()].set_index("optimizer")
at_largest = targets[targets.params == targets.params.max()]
for mode in ("default", "fused"):
    r = at_largest[at_largest.optimizer.str.endswith(f"_{mode}")].median_ratio
    glue(f"cost-ratio-{mode}", f"{r.min():.2f} to {r.max():.2f}" if len(r) else "(not measured at this profile)",
         display=False)
    target = cost.STEP_TARGETS[mode][1]
    glue(f"cost-verdict-{mode}", ("meets" if r.max() <= target else "misses") if len(r) else "was not measured for",
         display=False)
glue("cost-md-over-adam-fused", ", ".join(f"{largest.loc[f'md_p{p:g}_default', 'vs_adam_fused']:.1f}"
                                         for p in ps if p != 2.0 and f"md_p{p:g}_default" in largest.index)
     or "(not measured)", display=False)
glue("cost-adam-default-over-fused", f"{largest.loc['adam_default', 'vs_adam_fused']:.1f}", display=False)

# %% [markdown]
# ```{glue:figure} table-cost
# :name: table-cost
#
# The paper's operation counts next to the measured time per parameter of one optimizer step at the
# largest size (SGD is mirror descent at $p = 2$). Numbers: `_build/results/table-cost.csv`.
# ```
#
# ```{glue:figure} table-cost-training
# :name: table-cost-training
#
# One training step (forward, backward, optimizer step; batch of 100, one thread, as a chapter's run)
# of the sentiment encoder of chapter 04 (width 24, three layers and heads, sentences of 32 tokens) and
# of the vision transformer of chapter 07 (28-pixel images, width 64, depth 3), at this book's default
# sizes, with each optimizer as those chapters build it (`mdlib.experiments.methods.make_optimizer`): the median time
# and the median over rounds of the ratio to Adam's step in the same round, with its 95 % interval.
# Numbers: `_build/results/table-cost-training.csv`.
# ```
#
# ```{glue:figure} table-cost-vit
# :name: table-cost-vit
#
# One training step (forward, backward, optimizer) of the vision transformer, batch of the paper's
# size, per optimizer (each at step size $10^{-4}$), and the time of 2000 epochs of 50,000 images
# extrapolated from it. Numbers: `_build/results/table-cost-vit.csv`.
# ```
#
# ## What we got, next to the paper
#
# Measured on {glue:text}`cost-hardware` ({glue:text}`cost-torch`).
#
# - **The optimizer step.** At {glue:text}`cost-largest` parameters, mirror descent's default step
#   takes {glue:text}`cost-ratio-default` times as long as torch's default Adam's (at $p$ = 1.1,
#   1.75 and 3; it {glue:text}`cost-verdict-default` the target of at most 1), and its fused step
#   {glue:text}`cost-ratio-fused` times as long as fused Adam's (it {glue:text}`cost-verdict-fused`
#   the target of at most 1.10; {numref}`fig-cost-step`). The paper's counts put SGD first, as
#   measured, but do not predict the rest: every step here is limited by memory traffic and by how
#   many passes it makes over the arrays, not by arithmetic. Adam's default step, a loop of torch
#   operations over the tensors, takes {glue:text}`cost-adam-default-over-fused` times as long as
#   its fused kernel with the same arithmetic. Mirror descent's default step is such a loop too: per
#   tensor, the two halves of {eq}`eq-md-update`: one operation for the new dual $u - \eta g$, a few
#   for the power $|u|^{1/(p-1)}$ (written straight into the parameter), and one pass that checks
#   the new parameters are finite, at {glue:text}`cost-md-over-adam-fused` times fused Adam's time
#   for $p$ = 1.1, 1.75 and 3. The fused step is the same update written as one expression per
#   tensor and compiled by `torch.compile`: one pass reads the dual and the gradient, writes the new
#   dual into a spare buffer and the new parameter in place, and tracks in the same loop the largest
#   $|w|$, which is finite only if every new entry is (a float maximum: the boolean masks of an
#   `isfinite(w).all()` check took about 15 % of the fused step when we measured it); a failed check
#   rebuilds the parameters from the untouched dual and raises (the optimizer never leaves
#   infinities or half a step behind). That is four arrays through memory, six transfers with the
#   read a cache makes before overwriting a line, against fused Adam's seven (it reads the
#   parameter, the gradient and two moments and writes three of them back): about the same traffic,
#   and about the same time. The power is cheap arithmetic at every $p$ timed: $|u|^{10}$ by
#   squaring at $p = 1.1$, a square root at $p = 3$, and in the fused step at $p = 1.75$ $|u|^{4/3}$
#   from a Newton iteration for $|u|^{-1/3}$ seeded by the float's exponent bits, about a third of
#   the operations of $\exp(\tfrac{4}{3}\log|u|)$, which the default step uses, hence its larger
#   time. Where it needs a general power, the default step uses exp and log rather than torch's
#   `pow`, which is slower on a CPU and under `torch.compile`; the fused expression is for
#   `torch.compile` only: run eagerly, each of its operations would be a pass over memory.
# - **Training the chapters' models.** In a training step of the chapters' own models at this book's
#   sizes, mirror descent takes {glue:text}`cost-train-ratio` times as long as Adam
#   ({numref}`table-cost-training`), {glue:text}`cost-train-verdict` the target of at most 1.10: the
#   step is dominated by the forward and backward passes. The chapters' runs therefore use each
#   optimizer's default implementation on a CPU, as torch does (compiling the optimizer would buy
#   them little), and mirror descent's fused step on a GPU. On a CPU they also train several runs at
#   once, one thread each (`workers`): small models train faster as $N$ one-thread processes than as
#   one $N$-thread process.
# - **Training the paper's model.** On the vision transformer ({glue:text}`cost-vit-params`
#   parameters) the slowest optimizer's training step takes {glue:text}`cost-vit-spread:.2f` times the
#   fastest's: the optimizer is a small part of a step dominated by the forward and backward passes,
#   as in the paper's report of small differences between methods. Extrapolated, 2000 epochs with
#   Adam would take about {glue:text}`cost-vit-hours-adam:,.0f` hours on this machine, against the
#   paper's {glue:text}`paper-hours-cifar10` on a V100 GPU.
#
# **What this shows.** Mirror descent is a practical optimizer: its step costs about what Adam's does,
# implementation for implementation, and it is a small part of a training step. **What it does not
# show.** Timings depend on the machine (this page records it), on tensor sizes and on threads; the
# book's numbers are medians of interleaved runs on a shared CPU, and only ratios measured side by side
# should be compared. The optimizer steps and the chapters' training steps are timed on the CPU on any
# machine (only the paper's vision transformer moves to a GPU when there is one).
