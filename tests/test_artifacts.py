"""Saving figures and tables under their labels, with provenance, and glueing them (``mdlib.book.artifacts``)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from mdlib.book import artifacts, plots, provenance  # noqa: E402
from mdlib.book.scorecard import schema  # noqa: E402


pytestmark = pytest.mark.usefixtures("build_dir")  # conftest's: what they write goes to a temporary build


def test_saving_has_one_home():
    """plots draws, artifacts saves: no second path to the savers."""
    assert not {"save_figure", "save_table", "glue_paper", "Saved"} & set(vars(plots))
    plots.set_theme()
    assert plt.rcParams["savefig.dpi"] == artifacts.DPI


def test_save_figure_writes_png_pdf_csv(build_dir):
    plots.set_theme()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0], color=plots.p_color(1.1), label=plots.p_label(1.1))
    data = pd.DataFrame({"step": [0, 1], "value": [1.0, 0.0]})
    saved = artifacts.save_figure(fig, "fig-test", data=data)
    assert saved.files["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert saved.files["pdf"].read_bytes()[:5] == b"%PDF-"
    assert saved.files["png"] == build_dir.resolve() / "figures" / "fig-test.png"
    assert pd.read_csv(build_dir / "results" / "fig-test.csv").equals(data)
    assert not plt.fignum_exists(fig.number)  # closed, so the inline backend does not show it twice
    assert sorted(p.name for p in (build_dir / "figures").iterdir()) == ["fig-test.json", "fig-test.pdf",
                                                                           "fig-test.png"]
    # the glued bundle carries the announcement the book test reads
    bundle, meta = artifacts._Glued({"image/png": ""}, saved)._repr_mimebundle_()
    assert meta["mdlib"] == {"kind": "figure", "label": "fig-test",
                             "files": ["figures/fig-test.png", "figures/fig-test.pdf", "results/fig-test.csv"]}


def test_pdf_is_reproducible(build_dir, monkeypatch):
    fixed = provenance.record("fig-same", "figure")  # the PDF carries it, with the time of the save
    monkeypatch.setattr(provenance, "record", lambda label, kind, files=None: fixed)

    def draw():
        fig, ax = plt.subplots()
        ax.plot([0, 1, 2], [0, 1, 4])
        return artifacts.save_figure(fig, "fig-same").files["pdf"].read_bytes()

    assert draw() == draw()


def test_save_table_and_index_handling(build_dir):
    df = pd.DataFrame({"p": [1.1, 2.0], "acc": [83.5, 81.7]})
    artifacts.save_table(df[df.acc > 0], "tab-acc")
    assert pd.read_csv(build_dir / "results" / "tab-acc.csv").columns.tolist() == ["p", "acc"]
    artifacts.save_table(df.set_index("p"), "tab-indexed")
    assert pd.read_csv(build_dir / "results" / "tab-indexed.csv").columns.tolist() == ["p", "acc"]


def test_an_empty_table_with_a_reason_is_saved_as_a_placeholder(build_dir):
    """An empty table given ``absent`` is the placeholder that says why (its schema not applied, the
    scorecard reads its note); a table with rows is saved as it is, ``absent`` ignored."""
    empty = pd.DataFrame(columns=["embedding_std", "contrast", "n", "value"])
    artifacts.save_table(empty, "table-sentiment-contrasts", absent="no 2 x 2 in this build")
    saved = pd.read_csv(build_dir / "results" / "table-sentiment-contrasts.csv")
    assert schema.placeholder(saved) and saved.note.tolist() == ["no 2 x 2 in this build"]
    artifacts.save_table(pd.DataFrame({"p": [1.1]}), "tab-kept", absent="unused")
    assert pd.read_csv(build_dir / "results" / "tab-kept.csv").columns.tolist() == ["p"]


def test_bad_labels_and_inputs():
    fig = plt.figure()
    for label in ["", "has space", "../up", "a/b", "-dash"]:
        with pytest.raises(ValueError, match="invalid label"):
            artifacts.save_figure(fig, label)
    with pytest.raises(TypeError, match="matplotlib Figure"):
        artifacts.save_figure("not a figure", "fig-x")
    with pytest.raises(TypeError, match="DataFrame"):
        artifacts.save_figure(fig, "fig-x", data=[1, 2])
    plt.close(fig)


def test_axes_and_grids_are_accepted(build_dir):
    fig, ax = plt.subplots()
    artifacts.save_figure(ax, "fig-from-axes")
    assert (build_dir / "figures" / "fig-from-axes.png").is_file()


def test_glue_paper_glues_every_quote_and_prints_nothing(monkeypatch):
    import myst_nb

    from mdlib.experiments import paper

    glued = {}
    monkeypatch.setattr(artifacts, "_in_kernel", lambda: True)
    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display=True: glued.update({name: (value, display)}))
    assert artifacts.glue_paper() is None  # a chapter's cell that ends with it shows no output
    assert glued == {name: (text, False) for name, text in paper.quotes().items()}
