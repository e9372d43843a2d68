"""The chapter registry (``mdlib.book.chapters``): it lists the book's chapters as ``_toc.yml``,
``notebooks/`` and every profile do, no other module types a chapter's name, each chapter reads the
data it read before the registry, and mdlib's modules import each other without a cycle."""

from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path

import pytest
import yaml

from mdlib.book import book, chapters, execute, pages, profiles, scorecard
from mdlib.experiments import sentiment
from mdlib.runs import store

ROOT = Path(__file__).resolve().parents[1]

CHAPTER_NAME = re.compile(r"\b\d\d_[a-z_]+\b")


def _modules(root: Path) -> dict[str, Path]:
    """Every module of mdlib under ``root``: dotted name -> file (a package by its ``__init__.py``)."""
    found = {}
    for path in sorted((root / "mdlib").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes inside ``if TYPE_CHECKING:`` blocks (imports that never run)."""
    skipped = set()
    for node in ast.walk(tree):
        test = getattr(node, "test", None)
        if isinstance(node, ast.If) and (getattr(test, "id", None) or getattr(test, "attr", None)) == "TYPE_CHECKING":
            skipped |= {id(inner) for statement in node.body for inner in ast.walk(statement)}
    return skipped


def import_graph(root: Path) -> dict[str, set[str]]:
    """mdlib's modules under ``root`` -> the mdlib modules each imports anywhere in it (at module level or
    inside a function; ``from package import module`` counts as the module), TYPE_CHECKING blocks left out."""
    modules = _modules(root)
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text("utf-8"))
        skipped = _type_checking_only(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imported = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names if alias.name in modules}
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]) if node.level else ""
                source = ".".join(part for part in (base, node.module) if part)
                for alias in node.names:
                    target = f"{source}.{alias.name}"
                    imported |= {target} if target in modules else {source} & set(modules)
        graph[name] = imported - {name}
    return graph


def test_mdlib_imports_no_cycle():
    """Fails on the tree before the registry: data -> fetch -> data (fetch read data's CIFAR files) and
    data -> fetch -> sentiment -> data (fetch.needed), both through function-level imports."""
    graph = import_graph(ROOT)
    assert {"mdlib.experiments.fetch", "mdlib.book.chapters"} <= set(graph)  # the graph sees the modules
    assert "mdlib.experiments.fetch" in graph["mdlib.experiments.data"]
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as error:
        pytest.fail(f"an import cycle among mdlib's modules: {' -> '.join(error.args[1])}")


def test_the_import_graph_sees_imports_inside_functions(tmp_path):
    package = tmp_path / "mdlib"
    package.mkdir()
    (package / "__init__.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import mdlib.b\n")
    (package / "a.py").write_text("def f():\n    from mdlib import b\n")
    (package / "b.py").write_text("def g():\n    from mdlib.a import f\n")
    graph = import_graph(tmp_path)
    assert graph == {"mdlib": set(), "mdlib.a": {"mdlib.b"}, "mdlib.b": {"mdlib.a"}}
    with pytest.raises(graphlib.CycleError):
        tuple(graphlib.TopologicalSorter(graph).static_order())


def _chapter_names_typed(path: Path) -> list[str]:
    """The chapter names (``NN_name``) in the string constants of a module (docstrings and f-strings too)."""
    tree = ast.parse(path.read_text("utf-8"))
    return [f"line {node.lineno}: {name}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) for name in CHAPTER_NAME.findall(node.value)]


def test_only_the_registry_types_a_chapter_name():
    typed = {path.relative_to(ROOT).as_posix(): _chapter_names_typed(path) for path in _modules(ROOT).values()}
    assert all(CHAPTER_NAME.fullmatch(name) for name in chapters.NAMES)  # the pattern finds every chapter
    assert set(chapters.NAMES) <= {found.split(": ")[1] for found in typed["mdlib/book/chapters.py"]}
    elsewhere = {module: names for module, names in typed.items()
                 if names and module != "mdlib/book/chapters.py"}
    assert elsewhere == {}, "chapter names belong in mdlib/book/chapters.py only"


def test_the_registry_lists_the_books_chapters():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text("utf-8"))
    listed = [entry["file"] for part in toc["parts"] for entry in part["chapters"]]
    in_toc = [Path(file).name for file in listed if file.startswith("notebooks/")]
    assert list(chapters.NAMES) == in_toc  # the book's order
    book._check_toc()  # what the build checks
    profiles.check_notebooks()  # notebooks/NN_*.py
    for profile in profiles.list_profiles():
        assert set(profiles.load_profile(profile)) <= set(chapters.NAMES), profile
    assert len(set(chapters.NAMES)) == len(chapters.NAMES)


def test_a_profile_names_only_the_chapters_it_changes():
    """A chapter a profile does not name runs at its notebook's defaults, so a profile has no empty
    section (the default profile, the notebooks' own values, has none at all); the parameters page still
    lists every chapter at every profile."""
    sections = {profile: profiles.load_profile(profile) for profile in profiles.list_profiles()}
    assert sections["default"] == {}
    assert [(p, name) for p, found in sections.items() for name, values in found.items() if not values] == []
    for name in chapters.NAMES:
        defaults = profiles.executed_parameters(name, "default")
        for profile, found in sections.items():
            if name not in found:
                assert profiles.executed_parameters(name, profile) == defaults | {"profile": profile}, (name, profile)
    page = pages.parameters_page()
    assert [f"notebooks/{name}.py" for name in chapters.NAMES] == re.findall(r"Source `(notebooks/[^`]+)`", page)


def test_a_profile_without_a_chapter_still_refuses_unknown_names(tmp_path):
    """Leaving chapters out changes none of the checks: a section that names no notebook is refused
    whichever chapter runs, and a parameter the notebook lacks when it does; a chapter left out runs at
    its defaults."""
    profile = tmp_path / "trial.yaml"
    profile.write_text("05_token_selectoin:\n  heatmap_sentences: 4\n")
    for name in ("05_token_selection", "01_fixed_decoder_paths"):
        with pytest.raises(ValueError, match=r"params/trial.yaml has a section '05_token_selectoin', which is not a "
                                             r"notebook \(did you mean '05_token_selection'\?\)"):
            profiles.resolve_parameters(name, "trial", params_dir=tmp_path)
    profile.write_text("05_token_selection:\n  heatmap_sentence: 4\n")
    with pytest.raises(ValueError, match=r"05_token_selection: unknown parameter 'heatmap_sentence' in "
                                         r"params/trial.yaml"):
        profiles.resolve_parameters("05_token_selection", "trial", params_dir=tmp_path)
    profile.write_text("05_token_selection:\n  heatmap_sentences: 4\n")
    assert profiles.resolve_parameters("05_token_selection", "trial", params_dir=tmp_path) == {
        "heatmap_sentences": 4, "profile": "trial"}
    assert profiles.resolve_parameters("01_fixed_decoder_paths", "trial", params_dir=tmp_path) == {"profile": "trial"}


def test_a_notebook_the_registry_lacks_or_a_missing_one_is_named(tmp_path):
    """The registry is the one list of chapters: a chapter notebook it lacks is not quietly left out of
    the book, and a chapter without its notebook is named before anything runs."""
    for name in chapters.NAMES:
        (tmp_path / f"{name}.py").write_text("# %%\n")
    (tmp_path / "scratch.py").write_text("# %%\n")  # not a chapter's name: `mdlib run` may still execute it
    profiles.check_notebooks(tmp_path)
    (tmp_path / "10_new.py").write_text("# %%\n")
    (tmp_path / f"{chapters.NAMES[1]}.py").unlink()
    with pytest.raises(ValueError) as error:
        profiles.check_notebooks(tmp_path)
    assert str(error.value) == (f"no notebook {tmp_path / chapters.NAMES[1]}.py for the chapter {chapters.NAMES[1]}; "
                                f"{tmp_path / '10_new'}.py is not a chapter of mdlib.book.chapters.CHAPTERS: add its "
                                "Chapter entry there (and its line in _toc.yml)")
    assert profiles.resolve_notebook("10", tmp_path) == tmp_path / "10_new.py"  # still found by `mdlib run`


def test_the_toc_is_held_to_the_registry(monkeypatch):
    names = list(chapters.NAMES)
    monkeypatch.setattr(book, "toc_files", lambda: ["book/intro", *[f"notebooks/{n}" for n in toc_names]])
    toc_names = names[::-1]
    with pytest.raises(execute.BookError, match="another order than the registry's"):
        book._check_toc()
    toc_names = names[1:] + ["10_new"]
    with pytest.raises(execute.BookError, match=f"not in _toc.yml: {names[0]}; listed but not a chapter of "
                                                r"mdlib.book.chapters.CHAPTERS \(add its Chapter entry there\): 10_new"):
        book._check_toc()
    toc_names = names
    book._check_toc()


def test_a_chapter_reads_only_earlier_chapters_and_claims_its_own_labels():
    for i, chapter in enumerate(chapters.CHAPTERS):
        assert set(chapter.reads) <= set(chapters.NAMES[:i]), chapter.name
    labels = [label for chapter in chapters.CHAPTERS for label in chapter.claims]
    assert len(labels) == len(set(labels)) == len(chapters.BY_CLAIM)
    assert list(dict.fromkeys(claim.label for claim in scorecard.CLAIMS)) == list(chapters.BY_CLAIM)  # one order
    assert chapters.BY_CLAIM["table-1-variation"] == "04_sentiment"
    with pytest.raises(ValueError, match="no chapter '10_new' in mdlib.book.chapters.CHAPTERS"):
        chapters.chapter("10_new")



def test_the_single_core_chapters_run_side_by_side(monkeypatch):
    names = list(chapters.NAMES)
    groups = book.side_by_side(names, cores=2)
    assert [name for group in groups for name in group] == names  # the book's order
    assert groups[0] == [c.name for c in chapters.CHAPTERS if c.one_thread] == list(names[:3])
    assert all(len(group) == 1 for group in groups[1:])
    assert book.side_by_side(names, cores=1) == [[name] for name in names]
    fake = {name: chapters.Chapter(name, chapters.SentimentGrids(), reads=reads, one_thread=one)
            for name, reads, one in [("a", (), True), ("b", ("a",), True), ("c", (), True), ("d", (), False),
                                     ("e", (), True)]}
    monkeypatch.setattr(chapters, "_BY_NAME", fake)
    assert book.side_by_side(list(fake), cores=2) == [["a"], ["b", "c"], ["d"], ["e"]]  # b reads a: after it


def test_a_failed_chapter_beside_others_stops_the_build_after_its_group(monkeypatch):
    ran = []
    monkeypatch.setattr(book, "side_by_side", lambda names, cores: [names])
    monkeypatch.setattr(book, "_cores", lambda: 2)
    monkeypatch.setattr(book, "_run_apart", lambda name, profile: ran.append(name) or (int(name == "b"), 1.0))
    with pytest.raises(execute.NotebookError, match="b failed at profile 'smoke'.*mdlib run b --profile smoke"):
        book._execute(["a", "b", "c"], "smoke")
    assert sorted(ran) == ["a", "b", "c"]  # the others finished
    monkeypatch.setattr(book, "_run_apart", lambda name, profile: (0, 2.0))
    assert book._execute(["a", "c"], "smoke") == {"a": 2.0, "c": 2.0}

#: What each chapter read before the registry (``fetch.needed`` at 9ad93d2), at each profile: with no Table 1
#: grid in the results store, and (``GRID``) once chapter 04 has recorded one built on IMDb.
NOTHING = {"01_fixed_decoder_paths": [], "02_single_instance_path": [], "03_joint_training": [], "08_cost": []}
READ_BEFORE = {
    "smoke": NOTHING | {"04_sentiment": ["rotten_tomatoes", "wordpiece_vocab"],
                        "05_token_selection": ["wordpiece_vocab", "rotten_tomatoes"], "06_weights": ["wordpiece_vocab"],
                        "07_vision": ["fashion_mnist"], "09_step_sizes": ["rotten_tomatoes", "wordpiece_vocab"]},
    "default": NOTHING | {"04_sentiment": ["rotten_tomatoes", "wordpiece_vocab"],
                          "05_token_selection": ["wordpiece_vocab", "rotten_tomatoes"],
                          "06_weights": ["wordpiece_vocab"], "07_vision": ["fashion_mnist"],
                          "09_step_sizes": ["rotten_tomatoes", "wordpiece_vocab"]},
    "paper": NOTHING | {"04_sentiment": ["imdb", "wordpiece_vocab"],
                        "05_token_selection": ["wordpiece_vocab", "rotten_tomatoes"], "06_weights": ["wordpiece_vocab"],
                        "07_vision": ["cifar10", "cifar100"], "09_step_sizes": ["rotten_tomatoes", "wordpiece_vocab"]},
}
GRID = {"05_token_selection": ["imdb", "wordpiece_vocab", "rotten_tomatoes"], "06_weights": ["imdb", "wordpiece_vocab"]}


@pytest.mark.parametrize("profile", list(READ_BEFORE))
def test_each_chapter_reads_the_data_it_read_before(profile, tmp_path, monkeypatch):
    monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path / "build"))

    def read() -> dict[str, list[str]]:
        return {c.name: c.needed(profiles.executed_parameters(c.name, profile)) for c in chapters.CHAPTERS}

    assert read() == READ_BEFORE[profile]
    built = sentiment.chapter_grids(**profiles.executed_parameters("04_sentiment", profile))[0]
    store.set_name(sentiment.grid_name(profile), sentiment.GRID_KIND, built.to_dict() | {"dataset": "imdb"})
    assert read() == READ_BEFORE[profile] | GRID
    with pytest.raises(ValueError, match="07_vision reads unknown data 'mnist'"):
        chapters.chapter("07_vision").needed({"datasets": ["mnist"], "profile": profile})
