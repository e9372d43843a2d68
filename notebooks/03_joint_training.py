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
# # Training attention and decoder together (E3)
#
# **The claim.** When $W$ and the decoder $v$ are trained together, the paper proves a
# regularization-path result: under extra assumptions, the $\ell_p$-constrained minimizers converge
# in direction to the $\ell_p$ attention SVM $W^{\mathrm{mm}}_p$ {eq}`eq-attention-svm` and to the
# $\ell_p$ decoder SVM
#
# ```{math}
# :label: eq-decoder-svm
# v^{\mathrm{mm}}_p = \arg\min_v \|v\|_p \quad \text{s.t.} \quad y_i\, x_{i\alpha_i}^\top v \ge 1
# \ \ \text{for all } i,
# ```
#
# with $\alpha_i$ the selected token of example $i$ {cite}`julistiono2026mirror`. For the iterative
# algorithm there is no theorem; the paper's joint runs are empirical support, and so are ours.
#
# **What we run.** The paper's fixed two-example instance ($n = 2$, $T = 3$, $d = 2$, the comparison
# token $z_i$ is the first token of $X_i$), $W(0) = 0$ and $v(0) = 0$, both trained by the
# $\ell_p$ mirror-descent step {eq}`eq-md-update` with each tensor's gradient normalized by its own dual
# norm, step 0.1. At $v = 0$ the
# gradient in $W$ is exactly zero, so the first step moves only $v$.

# %% tags=["parameters"]
profile = "default"  # the params/ profile that produced this page (set by the pipeline)
ps = [1.75, 2.0, 3.0]  # exponents p of mirror descent
steps = [1500, 2000, 20000]  # steps for each exponent (the paper's counts)
lr = 0.1  # step size of the normalized step, for W and for v
first_steps = 150  # window of the probability panel

# %%
from myst_nb import glue

from mdlib.book import artifacts, plots
from mdlib.experiments import synthetic

plots.set_theme()
if len(steps) != len(ps):
    raise ValueError(f"steps ({steps}) needs one entry per exponent ({ps})")
config = dict(steps={f"{p:g}": s for p, s in zip(ps, steps)}, lr=lr, points=300)
result = synthetic.joint_training_experiment(config, progress=True)
probabilities, W_paths, v_paths, summary = (result[k] for k in ("probabilities", "W", "v", "summary"))
print(f"profile={profile}: steps={dict(zip(ps, steps))}, lr={lr}")

# %% tags=["hide-input"]
fig = plots.e3_joint_figure(probabilities, W_paths, v_paths, ps, first_steps)
artifacts.save_figure(fig, "fig-e3-joint", data=probabilities)
artifacts.save_table(W_paths, "fig-e3-joint-W", glue=False)
artifacts.save_table(v_paths, "fig-e3-joint-v", glue=False)

# %% [markdown]
# ```{glue:figure} fig-e3-joint
# :name: fig-e3-joint
#
# Joint training, one row per exponent $p$. Left: over the first steps, the softmax weight on each
# example's finally selected token (colour) and the classifier's probability of the correct label
# $\sigma(y_i f_i)$ (grey); solid line example 1, dotted example 2. Middle: the entries of
# $W(k)/\|W(k)\|_p$ and, dashed, of $W^{\mathrm{mm}}_p/\|W^{\mathrm{mm}}_p\|_p$. Right: the same for
# $v$ and the decoder SVM. Numbers: `_build/results/fig-e3-joint.csv` (probabilities),
# `fig-e3-joint-W.csv`, `fig-e3-joint-v.csv`.
# ```

# %% tags=["hide-input"]
table = summary.rename(columns={"p": "p", "selected": "selected tokens (1-based)",
                                "W_divergence": "W: divergence to attention SVM",
                                "v_divergence": "v: divergence to decoder SVM", "final_loss": "final loss"})
artifacts.save_table(summary, "table-e3-final", styled=table.style.format(
    {"p": "{:g}", "W: divergence to attention SVM": "{:.2e}", "v: divergence to decoder SVM": "{:.2e}",
     "final loss": "{:.2e}"})
    .hide(axis="index"))
for _, row in summary.iterrows():
    glue(f"e3-W-{row.p:g}", row.W_divergence, display=False)
    glue(f"e3-v-{row.p:g}", row.v_divergence, display=False)
glue("e3-selected", "; ".join(f"{s} at p = {p:g}" for p, s in zip(summary.p, summary.selected)), display=False)

# %% [markdown]
# ```{glue:figure} table-e3-final
# :name: table-e3-final
#
# Where each joint run ends: the selected tokens and the directional Bregman divergences
# {eq}`eq-bregman` (training geometry) of $W$ and $v$ to their SVMs {eq}`eq-attention-svm` and
# {eq}`eq-decoder-svm` at the last step. Numbers: `_build/results/table-e3-final.csv`.
# ```
#
# ## What we got, next to the paper
#
# The paper's joint-training figures show the selected token's softmax probability and the
# classifier's probability rising to one within the first steps, and the normalized entries of $W$
# and $v$ settling on the attention-SVM and decoder-SVM values. Here the selected tokens (example 1,
# example 2; 1-based) are {glue:text}`e3-selected`: the geometry changes which token the attention
# settles on, not only the direction it settles in. At the last step the directional divergences are
# {glue:text}`e3-W-1.75:.1e` / {glue:text}`e3-v-1.75:.1e` ($W$ / $v$, $p = 1.75$),
# {glue:text}`e3-W-2:.1e` / {glue:text}`e3-v-2:.1e` ($p = 2$) and {glue:text}`e3-W-3:.1e` /
# {glue:text}`e3-v-3:.1e` ($p = 3$): both parameters align with their own $\ell_p$ max-margin
# solutions.
#
# **What this shows.** On this instance, the iterative joint algorithm behaves as the
# regularization-path theory predicts: the attention picks one token per example and the two blocks
# of parameters converge in direction to the two SVMs of the same geometry. **What it does not
# show.** A single two-example instance is an illustration; no theorem covers the iterative joint
# dynamics, and a final loss of zero in float64 only means $y_i f_i$ exceeds about 745.
