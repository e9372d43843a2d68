"""Figure/table saving, the theme's fixed colours, and the build-directory paths."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from mdlib.book import plots, provenance
from mdlib.experiments import paths  # noqa: E402


@pytest.fixture(autouse=True)
def build_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path / "out"))
    return tmp_path / "out"


def test_paths_follow_the_environment(build_dir, monkeypatch):
    assert paths.build_dir() == build_dir.resolve()
    assert paths.figures_dir() == build_dir.resolve() / "figures"
    assert paths.results_dir() == build_dir.resolve() / "results"
    assert paths.runs_dir() == build_dir.resolve() / "runs"
    assert paths.html_dir() == build_dir.resolve() / "_build" / "html"
    monkeypatch.delenv("MDLIB_BUILD_DIR")
    assert paths.build_dir() == paths.root() / "_build"
    assert paths.html_dir() == paths.root() / "_build" / "html"
    assert paths.jupyter_book_output() == paths.root()
    assert (paths.root() / "mdlib" / "experiments" / "paths.py").is_file()


def test_save_figure_writes_png_pdf_csv(build_dir):
    plots.set_theme()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0], color=plots.p_color(1.1), label=plots.p_label(1.1))
    data = pd.DataFrame({"step": [0, 1], "value": [1.0, 0.0]})
    saved = plots.save_figure(fig, "fig-test", data=data)
    assert saved.files["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert saved.files["pdf"].read_bytes()[:5] == b"%PDF-"
    assert saved.files["png"] == build_dir.resolve() / "figures" / "fig-test.png"
    assert pd.read_csv(build_dir / "results" / "fig-test.csv").equals(data)
    assert not plt.fignum_exists(fig.number)  # closed, so the inline backend does not show it twice
    assert sorted(p.name for p in (build_dir / "figures").iterdir()) == ["fig-test.json", "fig-test.pdf",
                                                                           "fig-test.png"]
    # the glued bundle carries the announcement the book test reads
    bundle, meta = plots._Glued({"image/png": ""}, saved)._repr_mimebundle_()
    assert meta["mdlib"] == {"kind": "figure", "label": "fig-test",
                             "files": ["figures/fig-test.png", "figures/fig-test.pdf", "results/fig-test.csv"]}


def test_pdf_is_reproducible(build_dir, monkeypatch):
    fixed = provenance.record("fig-same", "figure")  # the PDF carries it, with the time of the save
    monkeypatch.setattr(provenance, "record", lambda label, kind, files=None: fixed)

    def draw():
        fig, ax = plt.subplots()
        ax.plot([0, 1, 2], [0, 1, 4])
        return plots.save_figure(fig, "fig-same").files["pdf"].read_bytes()

    assert draw() == draw()


def test_save_table_and_index_handling(build_dir):
    df = pd.DataFrame({"p": [1.1, 2.0], "acc": [83.5, 81.7]})
    plots.save_table(df[df.acc > 0], "tab-acc")
    assert pd.read_csv(build_dir / "results" / "tab-acc.csv").columns.tolist() == ["p", "acc"]
    plots.save_table(df.set_index("p"), "tab-indexed")
    assert pd.read_csv(build_dir / "results" / "tab-indexed.csv").columns.tolist() == ["p", "acc"]


def test_bad_labels_and_inputs():
    fig = plt.figure()
    for label in ["", "has space", "../up", "a/b", "-dash"]:
        with pytest.raises(ValueError, match="invalid label"):
            plots.save_figure(fig, label)
    with pytest.raises(TypeError, match="matplotlib Figure"):
        plots.save_figure("not a figure", "fig-x")
    with pytest.raises(TypeError, match="DataFrame"):
        plots.save_figure(fig, "fig-x", data=[1, 2])
    plt.close(fig)


def test_axes_and_grids_are_accepted(build_dir):
    fig, ax = plt.subplots()
    plots.save_figure(ax, "fig-from-axes")
    assert (build_dir / "figures" / "fig-from-axes.png").is_file()


def test_p_colors_are_fixed_and_distinct():
    main = [plots.p_color(p) for p in (1.1, 1.75, 2, 3)]
    assert len(set(main)) == 4
    assert plots.p_color(2) == plots.p_color(2.0) == plots.p_color("2") == plots.p_color("gd")
    import seaborn as sns

    spare = [sns.color_palette("colorblind", 10)[i] for i in plots._SPARE_SLOTS]
    other = plots.p_color(1.3)  # other values: a spare slot, the same however p is written
    assert other in spare and other not in main and other == plots.p_color("1.3") == plots.p_color(1.3000001)
    assert plots.p_color("adam") not in main
    assert plots.p_palette([1.1, 3]) == {1.1: main[0], 3: main[3]}
    assert plots.p_label(2) == r"$\ell_{2}$ (GD)" and plots.p_label(1.1) == r"$\ell_{1.1}$"
