"""mdlib: l_p mirror descent for attention, the companion library of the book.

Modules, one responsibility each: ``mirror`` (maps, steps, divergences), ``optim`` (the torch
optimizer), ``svm`` (l_p max-margin problems), ``models`` (the paper's models and synthetic data),
``synthetic`` (batched training of the single-head model, experiments E1-E3), ``runs`` (results
store), ``plots`` (theme and figure saving), ``cli`` (``python -m mdlib``).
"""

__version__ = "0.1.0"
