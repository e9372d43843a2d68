"""The reproduction scorecard: which of the paper's claims hold in a build, decided by stated rules from
the results the chapters wrote (no torch). One claim's path through it:

- ``schema``: what every results table must hold, checked where a chapter writes it and where a claim reads it;
- ``evidence``: the results folder as a claim reads it, only CSVs the pipeline vouches for;
- ``rules``: the verdicts' rules, pure functions of numbers, and the sentence each prints;
- ``claims``: each claim's rule applied to the results, one ``Row`` per claim (``rows``), and the verdicts
  a chapter prints (``chapter_rows``, ``verdicts_text``, ``verdicts``);
- ``page``: ``book/scorecard.md`` and its forest plot.

The claims' rows are the package's API: ``from mdlib.book import scorecard; scorecard.rows(results_dir)``.
"""

from mdlib.book.scorecard.claims import (CLAIMS, DECOMPOSITION, FRAGILE, KQV_PARTS, STABLE_SHARE, Row, Stability,
                                         chapter_rows, rebuild_text, reference, rows, said, verdicts, verdicts_text)

__all__ = ["CLAIMS", "DECOMPOSITION", "FRAGILE", "KQV_PARTS", "Row", "STABLE_SHARE", "Stability", "chapter_rows",
           "rebuild_text", "reference", "rows", "said", "verdicts", "verdicts_text"]
