"""How the chapters say where a step-size grid's choice sits (``mdlib.experiments.step_grid``): the words
chapters 07 and 09 share on a choice at an end of the steps tried, and on the candidates tied with it."""

from __future__ import annotations

from typing import Callable, Sequence

from mdlib.experiments.step_grid import Choice

__all__ = ["edge_clause", "tie_clause"]


def edge_clause(name: str, chosen: float, tried: Sequence[float], first: Sequence[float], grow: int,
                shown: Callable[[float], str] = "{:.2g}".format) -> str:
    """Where ``chosen`` sits among the steps ``tried`` (the grid ``first`` and what it grew to), "" when it
    is strictly inside them; otherwise a clause saying which end, what was tried and why the grid stopped
    there: "ℓ1.1: 4.1 is the largest of 0.05, ..., 4.1, after the grid grew twice on that side (its
    most, ``grow``); the best step may lie beyond it". ``name``: the cell in words; ``shown``: a step in
    words."""
    tried = sorted(tried)
    if len(tried) == 1:
        return f"{name}: {shown(chosen)} is the only candidate (nothing to choose)"
    if tried[0] < chosen < tried[-1]:
        return ""
    top = chosen == tried[-1]
    grown = sum(x > max(first) for x in tried) if top else sum(x < min(first) for x in tried)
    times = {1: "once", 2: "twice"}.get(grown, f"{grown} times")
    why = (f"after the grid grew {times} on that side (its most)" if grown else
           "and the grid may not grow (grow = 0)" if grow == 0 else "")
    return (f"{name}: {shown(chosen)} is the {'largest' if top else 'smallest'} of {', '.join(map(shown, tried))}"
            + (f", {why}" if why else "") + "; the best step may lie beyond it")


def tie_clause(name: str, choice: Choice, shown: Callable[[float], str] = "{:.2g}".format) -> str:
    """The candidates tied with a choice, "" when none is: "Adam: 0.0003, 0.0009, 0.0027 (chosen: 0.0009,
    the middle one)"."""
    if len(choice.tied) < 2:
        return ""
    how = "the middle one" if len(choice.tied) % 2 else "the better of the middle two"
    return f"{name}: {', '.join(map(shown, choice.tied))} (chosen: {shown(choice.value)}, {how})"
