"""One source of truth for who wrote the paper: CITATION.cff. Every other place that names the paper's
authors or DOI (the bibliography, README, the book's introduction, each artifact's citation block) is
checked against it, and the software's version and release date agree with the package."""

import datetime
import re

import mdlib
from mdlib.book import provenance
from mdlib.experiments import paths

CFF = provenance.load_citation()
PAPER = CFF["preferred-citation"]
#: "Family, Given and Family, Given" as BibTeX spells the authors, from CITATION.cff alone.
AUTHORS = " and ".join(f"{a['family-names']}, {a['given-names']}" for a in PAPER["authors"])


def bib_field(entry: str, name: str) -> str:
    match = re.search(rf"^\s*{name}\s*=\s*\{{(.*?)\}},?\s*$", entry, flags=re.M)
    assert match, f"no {name} field in {entry[:60]!r}"
    return match.group(1)


def paper_entries() -> dict[str, str]:
    """The paper's BibTeX entry in each file that carries one."""
    found = {}
    for name in ("book/references.bib", "README.md", "book/intro.md"):
        text = (paths.root() / name).read_text("utf-8")
        match = re.search(r"@article\{julistiono2026mirror,.*?\n\}", text, flags=re.S)
        assert match, f"{name} no longer carries the paper's BibTeX entry"
        found[name] = match.group(0)
    return found


def test_the_paper_is_cited_with_the_authors_and_doi_of_citation_cff():
    assert PAPER["authors"][0] == {"family-names": "Julistiono", "given-names": "Addison Kristanto"}
    assert PAPER["doi"] == "10.48550/arXiv.2410.14581"
    assert {"type": "doi", "value": PAPER["doi"], "description": "the arXiv DOI"} in PAPER["identifiers"]
    for name, entry in paper_entries().items():
        assert bib_field(entry, "author") == AUTHORS, name
        assert PAPER["doi"] in entry, name


def test_no_page_keeps_the_old_misspelled_author():
    sources = [*paths.root().glob("*.md"), *paths.root().glob("*.cff"), *(paths.root() / "book").glob("*.md"),
               *(paths.root() / "book").glob("*.bib"), *(paths.root() / "notebooks").glob("*.py"),
               *(paths.root() / "mdlib").glob("*.py")]
    assert sources
    for path in sources:
        assert "Alvarado" not in path.read_text("utf-8"), path


def test_the_software_version_and_release_date_are_the_package_s():
    assert str(CFF["version"]) == mdlib.__version__
    assert isinstance(CFF["date-released"], datetime.date)


def test_every_artifact_block_cites_the_paper_with_a_resolvable_doi():
    record = {"label": "fig-e1-paths", "kind": "figure", "profile": "smoke", "reproduces": "Figure 3",
              "git": {"commit": "0123456789abcdef", "dirty": False}, "time": "2026-12-01T00:00:00"}
    block = provenance.reproduce_html(record, CFF, "Figure 1.1")
    bibtex, plain = provenance.paper_citation(CFF)
    assert bib_field(bibtex, "author") == AUTHORS and bib_field(bibtex, "doi") == PAPER["doi"]
    assert plain.startswith("Addison Kristanto Julistiono, Davoud Ataee Tarzanagh, Navid Azizan.")
    assert f"https://doi.org/{PAPER['doi']}" in block
    assert provenance.paper_citation({}) is None
