"""mdlib: l_p mirror descent for attention, the companion library of the book.

Modules, one responsibility each: ``mirror`` (maps, steps, divergences), ``optim`` (the torch
optimizer and ``make_optimizer``), ``svm`` (l_p max-margin problems), ``models`` (the single-head
model and its synthetic data, the sentiment encoder, the vision transformer), ``synthetic`` (batched
training of the single-head model, experiments E1-E3), ``fetch`` (real data files from package
registries, sha256-checked and cached), ``data`` (their readers), ``train`` (the training loop of
the real-data chapters), ``runs`` (the results store, and the runs and process pool that fill it),
``sentiment`` and ``vision`` (the real-data experiments E4-E6 and E7: run configs, sweep, grid), ``analysis`` (token scores,
interventions, pruning), ``plots`` (theme and figure saving), ``book`` (executing notebooks, building
the book), ``bench`` (benchmarks), ``schema`` (what each results table the scorecard reads must
hold), ``scorecard`` (the page of which claims hold, by stated rules), ``paths`` (where files live,
atomic writes), ``cli`` (``python -m mdlib``).
"""

__version__ = "0.1.0"


def first_line(text: object) -> str:
    """The first line of ``str(text)`` (e.g. an exception) without surrounding blanks; "" when empty."""
    return (str(text).strip().splitlines() or [""])[0]
