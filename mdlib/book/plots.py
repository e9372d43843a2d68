"""One look for every figure: the book's theme (``set_theme``), a fixed colour per exponent
(``p_color``, ``method_color``) and the drawing of each chapter's figures. Saving a figure or a table
under its label, with its provenance record, and glueing it into the chapter is
``mdlib.book.artifacts``'.

In a notebook::

    from mdlib.book import artifacts, plots
    plots.set_theme()
    fig, ax = plt.subplots()
    for p in ps:
        ax.plot(steps, curve[p], color=plots.p_color(p), label=plots.p_label(p))
    fig.tight_layout()  # (or plt.subplots(layout="constrained")); the theme sets no layout engine
    artifacts.save_figure(fig, "fig-e1-divergence", data=tidy_df)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from mdlib.book.artifacts import DPI
from mdlib.experiments import paper
# how a method is written, for the chapters: plots.p_label(1.1), plots.method_label("adam"), ...
from mdlib.experiments.methods import method_label, p_label  # noqa: F401

if TYPE_CHECKING:  # matplotlib, pandas and seaborn load lazily, in the functions that draw
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.typing import ColorType
    from numpy.typing import ArrayLike
    from torch import Tensor

    from mdlib.experiments.selection import SentenceSet

# Fixed palette slots (seaborn "colorblind") for the exponents the paper uses, so a given p has the
# same colour in every figure of the book.
# (0 blue, 1 orange, 2 green, 3 vermillion, 4 purple, 5 brown, 6 pink, 7 grey, 8 yellow, 9 sky blue;
# 1.75 and 3 get orange and purple, which stay apart for colour-blind readers and in greyscale.)
_PALETTE_SLOTS = {1.1: 0, 1.75: 1, 2.0: 2, 3.0: 4, 1.5: 9, 2.5: 5, 1.25: 6, 4.0: 3}
_NAMED_SLOTS = {"adam": 7, "adamw": 7, "sgd": 2, "gd": 2}
_SPARE_SLOTS = (8, 3, 5, 6, 9)


def set_theme(context: str = "notebook", **rc: Any) -> None:
    """The book's single theme: seaborn whitegrid, colorblind palette, readable sizes.

    Extra keyword arguments are matplotlib rc settings, e.g. ``set_theme(**{"figure.figsize": (8, 3)})``.
    """
    import seaborn as sns

    base = {
        "figure.figsize": (6.4, 4.0),
        "figure.dpi": 100,
        "savefig.dpi": DPI,
        "axes.titlesize": "large",
        "axes.labelsize": "medium",
        "legend.frameon": True,
        "legend.framealpha": 0.9,
        "lines.linewidth": 1.8,
        "pdf.fonttype": 42,  # embed TrueType: text stays text in the PDFs
        "svg.fonttype": "none",
    }
    base.update(rc)
    sns.set_theme(context=context, style="whitegrid", palette="colorblind", rc=base)


def p_color(p: float | str) -> tuple[float, float, float]:
    """The fixed colour of an l_p exponent (1.1, 1.75, 2, 3 and a few more), or of a named method
    such as ``"adam"``; other values get a stable colour from the spare palette slots."""
    import seaborn as sns

    palette = sns.color_palette("colorblind", 10)
    if isinstance(p, str):
        key = p.strip().lower()
        if key in _NAMED_SLOTS:
            return palette[_NAMED_SLOTS[key]]
        try:
            p = float(key)
        except ValueError:
            return palette[_SPARE_SLOTS[sum(map(ord, key)) % len(_SPARE_SLOTS)]]
    value = round(float(p), 6)
    if value in _PALETTE_SLOTS:
        return palette[_PALETTE_SLOTS[value]]
    return palette[_SPARE_SLOTS[int(round(value * 1000)) % len(_SPARE_SLOTS)]]


def method_color(optimizer: str, p: float | None = None) -> tuple[float, float, float]:
    """The colour of a real-data run's optimizer: ``p_color(p)`` for "md", else ``p_color(optimizer)``."""
    return p_color(p if optimizer == "md" else optimizer)


def magnitude_histogram(ax: Axes, magnitudes: Mapping[tuple[str, ColorType], ArrayLike], threshold: float = 0.06,
                        bins: int = 50) -> None:
    """Overlaid step histograms of |w| above ``threshold`` on a log count axis, one per method:
    ``magnitudes`` maps (label, colour) -> array of |w| (the paper's Fig. 9 view)."""
    import numpy as np

    top = max(float(np.max(values, initial=threshold)) for values in magnitudes.values())
    edges = np.linspace(threshold, max(top, threshold * 1.01), bins + 1)
    counted = 0
    for (label, color), values in magnitudes.items():
        kept = np.asarray(values)[np.asarray(values) > threshold]
        ax.hist(kept, bins=edges, histtype="step", color=color, linewidth=1.6, label=f"{label} ({kept.size})")
        counted += kept.size
    if counted:  # a log axis needs a positive count (a small model may have no entry above the threshold)
        ax.set_yscale("log")
    ax.set_xlabel(f"|w| (entries above {threshold:.3g})")
    ax.set_ylabel("count")


def weight_histograms(rows: Mapping[str, Mapping[tuple[str, ColorType], Mapping[str, Sequence[Tensor]]]],
                      threshold: float, kinds: Sequence[str] = ("key", "query", "value")) -> Figure:
    """``magnitude_histogram`` of each kind of attention matrix (columns ``kinds``) for each row of
    ``rows``: row title -> {(label, colour): a model's ``attention_weights()``}, the panels titled
    "<row>: <kind> weights", the panels of a row on one count axis. Returns the figure."""
    import matplotlib.pyplot as plt

    from mdlib.experiments.analysis import magnitudes

    fig, axes = plt.subplots(len(rows), len(kinds), figsize=(14, 3.8 * len(rows)), squeeze=False, sharey="row")
    for row, (title, weights) in zip(axes, rows.items()):
        for ax, kind in zip(row, kinds):
            magnitude_histogram(ax, {style: magnitudes(of[kind]) for style, of in weights.items()}, threshold=threshold)
            ax.set(title=f"{title}: {kind} weights")
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _method_style(key: str):
    from mdlib.experiments.methods import method

    return method_color(*method(key)), method_label(*method(key))


def training_curves(history: pd.DataFrame, methods: Sequence[str], stop: float | None = paper.STOP_TRAIN_ACCURACY, *,
                    by: str = "layers", titles: Mapping[Any, str] | None = None,
                    reference: Mapping[Any, float] | None = None, reference_label: str = "the paper") -> Figure:
    """The training of a grid (``Grid.history``, methods under their keys), one column per value of the
    column ``by`` (04: the depth, ``titles`` by default "L layers, L heads"; 07: the data set): above,
    the test accuracy at the evaluated epochs (solid: the mean over seeds while every seed runs, band:
    one standard deviation), with the stop rule ``stop`` (grey) also the running training accuracy
    (dotted, mean; a tick where each run stopped), and ``reference[value]`` (black dotted, in %) where
    given; below, the training loss (mean per example over the epoch, dropout on; log scale). Returns
    the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    columns = list(dict.fromkeys(history[by]))
    reference = reference or {}
    fig, axes = plt.subplots(2, len(columns), figsize=(5.8 * len(columns), 7.2), sharex="col", squeeze=False)
    for column, value in enumerate(columns):
        top, bottom = axes[0, column], axes[1, column]
        for key in methods:
            runs = history[(history[by] == value) & (history.method == key)]
            if runs.empty:
                continue
            color, label = _method_style(key)
            alive = runs.groupby("epoch")["seed"].count() == runs.seed.nunique()
            for metric, ax, scale in (("test_accuracy", top, 100), ("train_loss", bottom, 1)):
                curve = runs.dropna(subset=[metric]).groupby("epoch")[metric].agg(["mean", "std"])
                curve = curve[alive.reindex(curve.index, fill_value=False)]
                ax.plot(curve.index, scale * curve["mean"], color=color, label=label)
                ax.fill_between(curve.index, scale * (curve["mean"] - curve["std"].fillna(0)),
                                scale * (curve["mean"] + curve["std"].fillna(0)), color=color, alpha=0.2, lw=0)
            if stop is not None:
                train = runs.groupby("epoch")["train_accuracy"].mean()[alive]
                top.plot(train.index, 100 * train.values, color=color, ls=":", lw=1.2)
                for _, run in runs.groupby("seed"):
                    top.plot(run.epoch.iloc[-1], 100 * run.train_accuracy.iloc[-1], marker="|", color=color, ms=9)
        if stop is not None:
            top.axhline(100 * stop, color="0.5", ls=":", lw=1)
        if value in reference:
            top.axhline(reference[value], color="black", ls=":", lw=1, label=reference_label)
            top.legend(loc="lower right", fontsize="small")
        top.set(title=titles[value] if titles else f"{value} layers, {value} heads",
                ylabel=("accuracy (%)" if stop is not None else "test accuracy (%)") if column == 0 else None)
        bottom.set(xlabel="epoch", ylabel="training loss (per example)" if column == 0 else None, yscale="log")
        bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0, -1].legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    return fig


def movement_bars(table: pd.DataFrame, methods: Sequence[str], groups: Iterable[str] | None = None) -> Figure:
    """Relative movement ||W - W(0)|| / ||W(0)|| per parameter group (``sentiment.movement``): bars of
    the mean over seeds with 95 % t intervals, one colour per method, log scale. Returns the figure."""
    import matplotlib.pyplot as plt
    import numpy as np

    from mdlib.experiments.stats import mean_interval

    groups = list(groups or dict.fromkeys(table.group))
    fig, ax = plt.subplots(figsize=(7.6, 3.8))
    width = 0.8 / len(methods)
    for m, key in enumerate(methods):
        color, label = _method_style(key)
        stats = [mean_interval(table[(table.method == key) & (table.group == g)].movement) for g in groups]
        means = np.array([x[0] for x in stats])
        low = np.array([x[0] - x[1] if x[1] == x[1] else 0 for x in stats])
        high = np.array([x[2] - x[0] if x[2] == x[2] else 0 for x in stats])
        ax.bar(np.arange(len(groups)) + (m - (len(methods) - 1) / 2) * width, means, width, color=color, label=label,
               yerr=[np.minimum(low, means * 0.999), high], capsize=3)
    ax.set_xticks(range(len(groups)), groups)
    ax.set(yscale="log", ylabel="‖W − W(0)‖ / ‖W(0)‖")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def scale_series_figure(points: pd.DataFrame, variation_std: float) -> Figure:
    """The embedding-scale series (``chapter.series_points``): ℓ1.1 minus GD in points at each std's chosen
    steps, with its 95 % interval over the seed pairs and test sentences, against the embedding std (left)
    and against the ratio of the two methods' first-order embedding steps at those steps (right; 1: equal
    steps), both on log scales. A std whose chosen runs all reached the stop rule is a filled point; a std
    with a run stopped at the epoch cap is an open point standing apart (out of the regime the claim is
    about). On the left the filled points are joined in the order of the std; on the right, where the
    ratio follows each std's step choice and not the design, each point is labelled with its std instead.
    The variation's std is marked."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.2), sharey=True)
    for ax, x, label in ((axes[0], "embedding_std", "embedding std σ"),
                         (axes[1], "embedding_ratio", "ℓ1.1's embedding step / GD's, at the chosen steps")):
        for reached in (True, False):
            part = points[points.reached.astype(bool) == reached].sort_values(x)
            if part.empty:
                continue
            ax.errorbar(part[x], part.value, yerr=[part.value - part.low, part.high - part.value], fmt="o",
                        color="black", mfc="black" if reached else "white", capsize=3, zorder=3,
                        label="every chosen run at the stop rule" if reached else "a run at the epoch cap (apart)")
            if reached and ax is axes[0]:
                ax.plot(part[x], part.value, color="black", lw=1)
            if ax is axes[1]:
                for ratio, value, std in zip(part[x], part.value, part.embedding_std):
                    ax.annotate(f"σ {std:g}", (ratio, value), xytext=(5, 3), textcoords="offset points",
                                fontsize="x-small")
        ax.axhline(0, color="0.5", lw=0.8)
        ax.set(xscale="log", xlabel=label)
        ax.xaxis.set_minor_locator(plt.NullLocator())
    axes[0].axvline(variation_std, color="0.4", ls="-.", lw=1, label="the variation")
    axes[1].axvline(1.0, color="0.4", ls=":", lw=1, label="equal first-order embedding steps")
    stds = sorted(set(points.embedding_std))
    axes[0].set_xticks(stds, [f"{x:g}" for x in stds])
    low, high = min(points.embedding_ratio.min(), 1.0) / 1.5, max(points.embedding_ratio.max(), 1.0) * 1.5
    axes[1].set_xlim(low, high)
    ticks = [t for decade in (0.01, 0.1, 1, 10, 100) for t in (decade, 2 * decade, 5 * decade) if low <= t <= high]
    axes[1].set_xticks(ticks, [f"{t:g}" for t in ticks])
    axes[0].set_ylabel("ℓ1.1 − GD (points of test accuracy)")
    for ax in axes:
        ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(0, -0.18), frameon=False)
    fig.tight_layout()
    return fig


def token_heatmaps(heat: pd.DataFrame, sentences: SentenceSet, shown: Sequence[int], methods: Sequence[str],
                   seed: int) -> Figure:
    """Heat maps of the normalized [CLS] scores (``selection.heat_table``) of the sentences ``shown``
    (indices into ``sentences.ids``) for each method at ``seed``, tokens written in their cells and the
    pivotal word boxed in red. Returns the figure."""
    import matplotlib.pyplot as plt
    import numpy as np

    from mdlib.experiments import selection

    words = [selection.tokens(sentences.ids[i]) for i in shown]
    widest = max(len(w) for w in words)
    fig, axes = plt.subplots(1, len(methods), figsize=(max(4.5, 0.75 * widest) * len(methods),
                                                      0.45 * len(shown) + 1.4), squeeze=False)
    for ax, key in zip(axes[0], methods):
        cells = np.full((len(shown), widest), np.nan)
        part = heat[(heat.method == key) & (heat.seed == seed)]
        for r, i in enumerate(shown):
            row = part[part.sentence == i + 1].sort_values("position")
            cells[r, :len(row)] = row.score
        ax.imshow(cells, cmap="viridis", vmin=0, vmax=1, aspect="auto")
        for r, i in enumerate(shown):
            for c, token in enumerate(words[r]):
                ax.text(c, r, token, ha="center", va="center", fontsize=6.5,
                        color="black" if cells[r, c] > 0.6 else "white")
            j = sentences.positions[i]
            ax.add_patch(plt.Rectangle((j - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.6))
        ax.set_title(f"{_method_style(key)[1]}, seed {seed}")
        ax.set_xticks([])
        ax.set_yticks(range(len(shown)), [f"{i + 1}" for i in shown])
        ax.grid(False)
    fig.tight_layout()
    return fig


def _seed_dots(ax, table, methods, column, groups=None):
    """Bars of the mean of ``column`` per method (and group), with each seed's value as a dot."""
    import numpy as np

    groups = groups or [None]
    width = 0.8 / len(methods)
    for m, key in enumerate(methods):
        color, label = _method_style(key)
        for g, group in enumerate(groups):
            part = table[table.method == key] if group is None else table[(table.method == key) & (table.deleted == group)]
            x = g + (m - (len(methods) - 1) / 2) * width
            ax.bar(x, part[column].mean(), width, color=color, alpha=0.55, label=label if g == 0 else None)
            ax.plot(np.full(len(part), x), part[column], "o", color=color, ms=4)
    ax.set_xticks(range(len(groups)), [g or "" for g in groups])


def concentration_plot(table: pd.DataFrame, methods: Sequence[str]) -> Figure:
    """Concentration of the [CLS] attention (``selection.concentration_table``): normalized entropy and
    top-token share, bars of the mean over seeds with each seed as a dot. Returns the figure."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.4))
    for ax, (column, title) in zip(axes, (("entropy", "normalized entropy H / log n (lower: sharper)"),
                                          ("top_share", "share of the top token"))):
        _seed_dots(ax, table, methods, column)
        ax.set_title(title, fontsize="medium")
    axes[0].legend(fontsize="small")
    fig.tight_layout()
    return fig


def deletion_bars(drops: pd.DataFrame, methods: Sequence[str]) -> Figure:
    """The deletion control (``selection.deletion_table``): the mean drop of the predicted class's
    probability per deleted token and method, each seed a dot. Returns the figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    _seed_dots(ax, drops, methods, "drop", list(dict.fromkeys(drops.deleted)))
    ax.set_ylabel("drop of the predicted class's probability")
    ax.axhline(0, color="0.3", linewidth=0.8)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def pruning_curves(pruning: pd.DataFrame, methods: Iterable[str], chance: float | None = 0.5, *,
                   by: str | None = None, titles: Mapping[Any, str] | None = None) -> Figure:
    """Test accuracy against the fraction of weights pruned (``sparsity.pruning_table``, methods under
    their keys): mean ± one standard deviation over seeds per method, ``chance`` dotted (None: no
    line); one panel per value of the column ``by`` (07: the data set), titled ``titles[value]``, or
    one panel for all rows. Returns the figure."""
    import matplotlib.pyplot as plt

    methods = list(methods)
    panels = [None] if by is None else list(dict.fromkeys(pruning[by]))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.8 * len(panels), 4), squeeze=False)
    for ax, value in zip(axes[0], panels):
        rows = pruning if value is None else pruning[pruning[by] == value]
        for key in methods:
            curve = rows[rows.method == key].groupby("sparsity")["test_accuracy"].agg(["mean", "std"])
            color, label = _method_style(key)
            ax.errorbar(100 * curve.index, 100 * curve["mean"], yerr=100 * curve["std"].fillna(0), color=color,
                        marker="o", markersize=3.5, capsize=2.5, label=label)
        if chance is not None:
            ax.axhline(100 * chance, color="0.5", linestyle=":", linewidth=1)
        if titles is not None:
            ax.set_title(titles[value])
        ax.set_xlabel("weights of the matrices pruned (%, global magnitude, no retraining)")
        ax.set_ylabel("test accuracy (%)")
        ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def _coordinate(entry: str) -> str:
    """An entry name "W[0,1]" as math: $W_{0,1}$."""
    return "$" + entry.replace("W[", "W_{").replace("]", "}") + "$"


def e1_paths_figure(curves: pd.DataFrame, svm_ps: Sequence[float]) -> Figure:
    """Chapter 01's paths (``synthetic.fixed_decoder_experiment``'s ``curves``: rows train_p, svm_p, step,
    mean, q10, q90): one row of panels per training exponent, one column per SVM exponent of
    ``svm_ps``, the directional divergence against the step (mean over seeds, band: 10-90 %
    quantiles), log scale. Returns the figure."""
    import matplotlib.pyplot as plt

    ps = sorted(curves["train_p"].unique())
    fig, axes = plt.subplots(len(ps), len(svm_ps), figsize=(3.6 * len(svm_ps), 2.8 * len(ps)), sharex="row",
                             squeeze=False)
    for row, p in enumerate(ps):
        for col, q in enumerate(svm_ps):
            ax = axes[row, col]
            c = curves[(curves.train_p == p) & (curves.svm_p == q)]
            ax.plot(c.step, c["mean"], color=p_color(q), lw=1.8)
            ax.fill_between(c.step, c["q10"], c["q90"], color=p_color(q), alpha=0.25, lw=0)
            ax.set_yscale("log")
            if row == 0:
                ax.set_title(f"SVM {p_label(q)}")
            if col == 0:
                ax.set_ylabel(f"trained with {p_label(p)}\ndirectional divergence")
            if row == len(ps) - 1:
                ax.set_xlabel("step $k$")
    fig.tight_layout()
    return fig


def e1_stall_figure(stall: pd.DataFrame) -> Figure:
    """Chapter 01's normalizations compared (``stall``: rows train_p, method, step, mean; the path's
    divergence to its own SVM): one panel per training exponent, one line per method, the first
    solid and the others dashed, log scale. Returns the figure."""
    import matplotlib.pyplot as plt

    ps = list(dict.fromkeys(stall.train_p))
    fig, axes = plt.subplots(1, len(ps), figsize=(4.2 * len(ps), 3.3), squeeze=False)
    for ax, p in zip(axes[0], ps):
        for i, (name, c) in enumerate(stall[stall.train_p == p].groupby("method", sort=False)):
            ax.plot(c.step, c["mean"], ls="-" if i == 0 else "--", color=p_color(p), label=name)
        ax.set(yscale="log", xlabel="step $k$", title=f"trained with {p_label(p)}, own SVM")
    axes[0, 0].set_ylabel("directional divergence (mean)")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def e2_path_figure(normalized: pd.DataFrame, norms: pd.DataFrame, ps: Iterable[float]) -> tuple[Figure, list[str]]:
    """Chapter 02's single-instance path in the plane of the two entries of W where the ℓp SVM directions
    differ most (the spread of an entry's SVM value over p, plus a tenth of its mean size, breaks ties):
    left W(k) itself (the direction ``value`` times the norm of ``norms`` at that step; W(0) = 0) with
    each p's own SVM ray dashed, right the direction W(k)/||W(k)||_p with the SVM direction starred.
    ``normalized``: rows (p, entry, step, value, svm); ``norms``: rows (p, step, norm). Returns the
    figure and the two entries."""
    import matplotlib.pyplot as plt
    import numpy as np

    targets = normalized.drop_duplicates(["p", "entry"]).pivot(index="entry", columns="p", values="svm")
    spread = (targets.max(axis=1) - targets.min(axis=1)) + 0.1 * targets.abs().mean(axis=1)
    first, second = spread.sort_values(ascending=False).index[:2]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.8))
    for p in ps:
        rows = normalized[normalized.p == p]
        norm = norms[norms.p == p].set_index("step").norm
        a = rows[rows.entry == first].set_index("step")
        b = rows[rows.entry == second].set_index("step")
        color, label = p_color(p), p_label(p)
        x, y = (a.value * norm).fillna(0), (b.value * norm).fillna(0)
        left.plot(x, y, color=color, lw=1.8, label=f"path, {label}")
        direction = np.array([a.svm.iloc[0], b.svm.iloc[0]])
        ray = direction / np.linalg.norm(direction) * float(np.hypot(x, y).max())
        left.plot([0, ray[0]], [0, ray[1]], ls="--", color=color, lw=1.2)
        right.plot(a.value, b.value, color=color, lw=1.8, label=label)
        right.scatter(*direction, marker="*", s=160, color=color, edgecolor="black", zorder=3)
    left.scatter([0], [0], color="black", zorder=3, s=15)
    left.set(xlabel=_coordinate(first) + " of $W(k)$", ylabel=_coordinate(second) + " of $W(k)$",
             title="the path (dashed: own SVM ray)")
    right.set(xlabel=_coordinate(first) + r" of $W(k)/\|W(k)\|_p$",
              ylabel=_coordinate(second) + r" of $W(k)/\|W(k)\|_p$", title="its direction (star: own SVM direction)")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig, [first, second]


def e2_growth_figure(plain: pd.DataFrame, ps: Iterable[float]) -> Figure:
    """Chapter 02's plain-step curves against log k, per p: the norm ||W(k)||_p, 1 minus the attention on
    the selected token, and the directional divergence to the own SVM. ``plain``: rows (p, step, norm,
    selected_probability, divergence), steps above 0."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for p in ps:
        c = plain[plain.p == p]
        color, label = p_color(p), p_label(p)
        axes[0].plot(c.step, c.norm, color=color, label=label)
        axes[1].plot(c.step, 1 - c.selected_probability, color=color, label=label)
        axes[2].plot(c.step, c.divergence, color=color, label=label)
    axes[0].set(xscale="log", xlabel="step $k$ (log scale)", ylabel=r"$\|W(k)\|_p$", title="norm: linear in $\\log k$")
    axes[1].set(xscale="log", yscale="log", xlabel="step $k$ (log scale)",
                ylabel="1 - attention on the selected token", title="softmax saturation (min over examples)")
    axes[2].set(xscale="log", yscale="log", xlabel="step $k$ (log scale)", ylabel="directional divergence",
                title="distance to the own SVM direction")
    axes[0].legend()
    fig.tight_layout()
    return fig


def e3_joint_figure(probabilities: pd.DataFrame, W_paths: pd.DataFrame, v_paths: pd.DataFrame, ps: Sequence[float],
                    first_steps: int) -> Figure:
    """Chapter 03's joint training, one row per p: over the first ``first_steps`` steps, the attention on
    the selected token and the classifier's probability per example (``probabilities``: rows p, step,
    example, attention_selected, classifier); then the entries of W/||W||_p and v/||v||_p against
    their SVMs' (dashed; ``W_paths``, ``v_paths``: rows p, entry, step, value, svm)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(ps), 3, figsize=(13, 2.9 * len(ps)), squeeze=False)
    styles = {1: "-", 2: ":"}
    for row, p in enumerate(ps):
        color = p_color(p)
        early = probabilities[(probabilities.p == p) & (probabilities.step <= first_steps)]
        ax = axes[row, 0]
        for example, rows in early.groupby("example"):
            ax.plot(rows.step, rows.attention_selected, color=color, ls=styles.get(example, "--"),
                    label=f"attention, example {example}")
            ax.plot(rows.step, rows.classifier, color="0.35", ls=styles.get(example, "--"),
                    label=f"classifier, example {example}")
        ax.set(ylim=(0, 1.02), ylabel=f"{p_label(p)}\nprobability")
        for col, (frame, what) in enumerate(((W_paths, "W"), (v_paths, "v")), start=1):
            ax = axes[row, col]
            rows = frame[frame.p == p]
            for (entry, group), shade in zip(rows.groupby("entry"), (1.0, 0.75, 0.5, 0.3)):
                line, = ax.plot(group.step, group.value, lw=1.6, alpha=shade, color=color, label=entry)
                ax.axhline(group.svm.iloc[0], ls="--", lw=1, color=line.get_color(), alpha=shade)
            ax.set(ylabel=f"entries of ${what}/\\|{what}\\|_p$", ylim=(-1.05, 1.05))
            ax.legend(fontsize=7, ncol=2, loc="lower right")
        if row == 0:
            axes[0, 0].set_title(f"first {first_steps} steps")
            axes[0, 1].set_title("attention weights vs attention SVM (dashed)")
            axes[0, 2].set_title("decoder vs decoder SVM (dashed)")
            axes[0, 0].legend(fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("step $k$")
    fig.tight_layout()
    return fig


def cost_step_figure(steps: pd.DataFrame) -> Figure:
    """Chapter 08's optimizer step times against the number of parameters (``steps``: rows params,
    optimizer, ms, vs_adam_fused; optimizer names of ``mdlib.experiments.cost``: "sgd_fused",
    "adam_foreach", "md_p1.1_default", ...): left the median time of a step, right its ratio to fused Adam's;
    grey SGD, black Adam, mirror descent in its exponent's colour, the implementation by the line style."""
    import matplotlib.pyplot as plt

    styles = {"sgd_default": ("0.55", "--"), "sgd_fused": ("0.55", "-"), "adam_default": ("0.1", "--"),
              "adam_foreach": ("0.1", ":"), "adam_fused": ("0.1", "-")}
    line = {"default": "--", "foreach": ":", "fused": "-"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.3))
    for name, group in steps.groupby("optimizer", sort=False):
        if name in styles:
            color, ls = styles[name]
            label = name.replace("_", " ")
        else:
            p, mode = float(name.split("_")[1][1:]), name.split("_")[2]
            color, ls = p_color(p), line[mode]
            label = f"{method_label('md', p)}, {mode}"
        left.plot(group.params, group.ms, color=color, ls=ls, marker="o", ms=3, label=label)
        right.plot(group.params, group.vs_adam_fused, color=color, ls=ls, marker="o", ms=3)
    left.set(xscale="log", yscale="log", xlabel="float32 parameters", ylabel="ms per optimizer step (median)")
    right.set(xscale="log", yscale="log", xlabel="float32 parameters", ylabel="time / fused Adam's (median ratio)")
    right.axhline(1, color="black", lw=0.8)
    left.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def step_size_figure(runs: pd.DataFrame, metrics: Sequence[str] = ("validation_loss", "validation_accuracy")) -> Figure:
    """Chapter 09's sweep (``step_size_guide.StepSizes.runs``): one row of panels per metric, the final value
    (mean over seeds) against the step size, one line per exponent p; left against lr itself, right
    against the SGD step whose first step moves an entry of the matched scale as far
    (``sgd_equivalent_lr``: where the curves coincide, ``matched_lr``'s rule holds). A large open circle
    marks each p's chosen step; an x at the top edge a step at which a run overflowed or ended with a
    non-finite loss (at any seed). Horizontal lines: AdamW at its chosen step (dashed) and torch's SGD at
    the chosen step of p = 2 (dotted). Returns the figure."""
    import matplotlib.pyplot as plt

    names = {"validation_loss": "validation loss (final)", "validation_accuracy": "validation accuracy (final)"}
    md = runs[runs.optimizer == "md"]
    fig, axes = plt.subplots(len(metrics), 2, figsize=(12, 3.9 * len(metrics)), sharey="row", sharex="col",
                             squeeze=False)
    for row, metric in enumerate(metrics):
        for ax, x in zip(axes[row], ("lr", "sgd_equivalent_lr")):
            for i, (p, group) in enumerate(md.groupby("p", sort=True)):
                per = group.groupby("multiple").agg(x=(x, "first"), y=(metric, "mean"), diverged=("diverged", "any"),
                                                    chosen=("chosen", "any"))
                ok, bad, color = per[~per.diverged], per[per.diverged], p_color(p)
                ax.plot(ok.x, ok.y, color=color, marker="o", ms=4, label=p_label(p))
                ax.plot(ok.x[ok.chosen], ok.y[ok.chosen], ls="none", marker="o", ms=12, mfc="none", mec=color, mew=2)
                ax.plot(bad.x, [0.96 - 0.045 * i] * len(bad), ls="none", marker="x", ms=7, mew=2, color=color,
                        transform=ax.get_xaxis_transform())  # one height per p: the right panels share x
            for key, ls, name in (("adamw", "--", "AdamW, its chosen lr"), ("sgd", ":", "SGD (torch), p = 2's lr")):
                chosen = runs[(runs.method == key) & runs.chosen.astype(bool) & ~runs.diverged.astype(bool)]
                if len(chosen):
                    ax.axhline(chosen[metric].mean(), color=p_color(key), ls=ls, lw=1.4, label=name)
            ax.set_xscale("log")
        axes[row, 0].set_ylabel(names.get(metric, metric))
    axes[-1, 0].set_xlabel("step size lr")
    axes[-1, 1].set_xlabel("SGD-equivalent step: lr / ((p - 1) scale^(p - 2))")
    axes[0, 0].set_title("against the step size", fontsize="medium")
    axes[0, 1].set_title("against the SGD step it is matched to (matched_lr)", fontsize="medium")
    from matplotlib.lines import Line2D

    handles, labels = axes[0, 1].get_legend_handles_labels()
    handles += [Line2D([], [], ls="none", marker="o", ms=10, mfc="none", mec="0.3", mew=2),
                Line2D([], [], ls="none", marker="x", ms=7, mew=2, color="0.3")]
    labels += ["chosen (lowest validation loss; a tie: its middle)", "diverged (overflow or non-finite loss)"]
    fig.tight_layout(rect=(0, 0.08 if len(metrics) > 1 else 0.14, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize="small", frameon=False)
    return fig
