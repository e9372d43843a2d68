"""Token selection (E5) on the trained sentiment models: which token the [CLS] attention selects.

The sentences come as token ids: the authors' (``authors_sentences``), ours (``pivotal_sentences``)
and the test split's, each with its pivotal word's position (``designated_positions``, or
``lexicon_pivots`` from the sentiment lexicon); a model's measurements of them are its normalized
[CLS] scores per token (``attention_scores``) and the drop of its prediction when a token is deleted
(``deletion_drops``).

A ``SentenceSet`` holds token ids and, where a word is designated pivotal, its position: the authors'
40 sentences (the primary replication), our written sentences, the test sentences the lexicon
designates a pivot in, and every test sentence (no pivot: for the concentration of attention).

Each seed gives one model per method from the same initialization, so a seed is a pair and the
sentences are shared by every pair: outcomes are kept per seed and sentence (``win_table``) and their
rate is summarized with the seed as the unit and the sentences as a second sample (``estimates.win_rate``); concentration is compared seed by
seed (``estimates.entropy_gap``): the numbers the scorecard judges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from mdlib.experiments import analysis, data, estimates, paper, paths, sentiment
from mdlib.experiments.methods import key_text
from mdlib.experiments.stats import generalization_floor, mean_interval, wilson_interval

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from mdlib.models import EncoderClassifier

__all__ = ["AUTHORS_SHOWN", "pivotal_sentences", "authors_sentences", "pad", "tokens", "designated_positions",
           "lexicon_pivots", "length_batches", "attention_scores", "deletion_drops",
           "SentenceSet", "sentence_sets", "scores", "heat_table", "win_table", "seed_counts", "summary", "summary_view",
           "summary_text", "concentration_table", "concentration_text", "deletion_table", "deletion_text",
           "gate_text"]

#: What ``scores`` returns: {(method, seed): {set name: [normalized [CLS] scores per sentence]}}.
_Scored = Mapping[tuple[str, int], Mapping[str, Sequence[np.ndarray]]]


# --- the sentences, their pivots and the per-token measurements ------------------------------------


def pivotal_sentences() -> pd.DataFrame:
    """The project's hand-written sentences (data/pivotal_sentences.csv): sentence, pivotal, label."""
    return pd.read_csv(paths.data_file("pivotal_sentences.csv"))


#: The sentences of the authors' figures (Figs. 8, 13, 14): the first 40 their notebook keeps.
AUTHORS_SHOWN = 40


def authors_sentences(max_length: int = 64, shown: int = AUTHORS_SHOWN) -> pd.DataFrame:
    """The authors' token-selection sentences (data/authors_sentences.csv, from their notebook
    ``attn_map.ipynb``; see data/README.md) that their notebook keeps, those whose pivotal word is a
    whole WordPiece token of the sentence, the first ``shown`` of them (their figures show 40):
    number, sentence, pivotal, label."""
    table = pd.read_csv(paths.data_file("authors_sentences.csv"))
    vocabulary = sentiment.tokenizer(max_length)
    ids = sentiment.encode(table.sentence, max_length)
    kept = [vocabulary.token_to_id(word) in sequence for sequence, word in zip(ids, table.pivotal)]
    return table[kept].head(shown).reset_index(drop=True)


def pad(ids: list[list[int]] | list[Tensor], pad_id: int = 0) -> tuple[Tensor, Tensor]:
    """(input_ids, attention_mask) of unpadded id sequences, padded to the longest."""
    inputs, _ = sentiment.collate([(torch.as_tensor(x), torch.tensor(0)) for x in ids], pad_id)
    return inputs["input_ids"], inputs["attention_mask"]


def length_batches(ids: Sequence[Sequence[int]], batch_size: int) -> Iterable[np.ndarray]:
    """The positions of ``ids`` in batches of ``batch_size`` sequences of similar lengths (sorted by
    length, stable): each batch pads to little more than its own sequences (padding is masked, so a
    sequence's outputs do not depend on its batch)."""
    order = np.argsort([len(x) for x in ids], kind="stable")
    return (order[start:start + batch_size] for start in range(0, len(order), batch_size))


def tokens(ids: list[int], max_length: int = 64) -> list[str]:
    """The WordPiece strings of an id sequence."""
    vocabulary = sentiment.tokenizer(max_length)
    return [vocabulary.id_to_token(i) for i in ids]


def designated_positions(ids: list[list[int]], words: list[str], max_length: int = 64) -> np.ndarray:
    """The position of each sequence's designated word (first occurrence); the word must be a single
    WordPiece token of the vocabulary."""
    vocabulary = sentiment.tokenizer(max_length)
    positions = []
    for sequence, word in zip(ids, words):
        token = vocabulary.token_to_id(word)
        if token is None or token not in sequence:
            raise ValueError(f"the pivotal word {word!r} is not a single WordPiece token of its sentence; "
                             "choose a word the uncased vocabulary holds whole")
        positions.append(list(sequence).index(token))
    return np.asarray(positions)


def lexicon_pivots(ids: list[list[int]], min_valence: float = 2.0, max_length: int = 64) -> tuple[np.ndarray, list[str]]:
    """The automatically designated pivotal token of each sequence: the whole-word token (not a piece
    of a longer word) with the largest VADER |valence|, when that is at least ``min_valence`` and no
    other word of the sequence ties with it. Returns (positions, -1 where none; the words)."""
    lexicon = data.sentiment_lexicon()
    positions, words = [], []
    for sequence in ids:
        pieces = tokens(sequence, max_length)
        scored = [(abs(lexicon.get(t, 0.0)), j) for j, t in enumerate(pieces)
                  if not t.startswith("##") and not (j + 1 < len(pieces) and pieces[j + 1].startswith("##"))]
        scored.sort(reverse=True)
        top = scored[0] if scored else (0.0, -1)
        unique = len(scored) < 2 or scored[1][0] < top[0] or pieces[scored[1][1]] == pieces[top[1]]
        if top[0] >= min_valence and unique:
            positions.append(top[1])
            words.append(pieces[top[1]])
        else:
            positions.append(-1)
            words.append("")
    return np.asarray(positions), words


def attention_scores(model: EncoderClassifier, ids: list[list[int]], batch_size: int = 256) -> list[np.ndarray]:
    """Each sequence's normalized [CLS] attention scores (``analysis.cls_attention``), unpadded."""
    scores: list[np.ndarray] = [np.empty(0)] * len(ids)
    for batch in length_batches(ids, batch_size):
        block = analysis.cls_attention(model, *pad([ids[i] for i in batch])).numpy()
        for b, i in enumerate(batch):
            scores[i] = block[b, :len(ids[i])]
    return scores


def deletion_drops(model: EncoderClassifier, ids: list[list[int]], positions: ArrayLike, batch_size: int = 256) -> np.ndarray:
    """``analysis.probability_drop`` of deleting the token at ``positions[b]`` from each sequence."""
    positions = np.asarray(positions)
    drops = np.empty(len(ids))
    for batch in length_batches(ids, batch_size):
        where = torch.as_tensor(positions[batch], dtype=torch.long)
        drops[batch] = analysis.probability_drop(model, *pad([ids[i] for i in batch]), where).numpy()
    return drops


# --- the sets and the chapter's tables ----------------------------------------------------------


@dataclass(frozen=True)
class SentenceSet:
    """Sentences as token ids, with the position of each one's pivotal word (None: no pivots)."""

    name: str
    title: str
    ids: list[list[int]]
    positions: np.ndarray | None = None


def sentence_sets(dataset: str, max_length: int, min_valence: float) -> dict[str, SentenceSet]:
    """The sets of the chapter: "authors" (their 40 sentences), "written" (ours), "lexicon" (test
    sentences with a lexicon-designated pivot, ``lexicon_pivots``) and "test" (all of them)."""
    out = {}
    for name, title, table in (("authors", "the authors' sentences", authors_sentences(max_length)),
                               ("written", "our written sentences", pivotal_sentences())):
        ids = sentiment.encode(table.sentence, max_length)
        out[name] = SentenceSet(name, title, ids, designated_positions(ids, table.pivotal, max_length))
    test = sentiment.splits(dataset, 0, max_length)["test"]
    test_ids = [x.tolist() for x in test.ids]
    positions, _ = lexicon_pivots(test_ids, min_valence, max_length)
    keep = np.flatnonzero(positions >= 0)
    out["lexicon"] = SentenceSet("lexicon", "test sentences with a lexicon pivot", [test_ids[i] for i in keep],
                                 positions[keep])
    out["test"] = SentenceSet("test", "every test sentence", test_ids)
    return out


def scores(models: Mapping[tuple[str, int], torch.nn.Module], sets: Mapping[str, SentenceSet]) -> dict:
    """{(method, seed): {set name: [normalized [CLS] scores per sentence]}} for the sets with pivots."""
    return {key: {name: attention_scores(model, s.ids) for name, s in sets.items() if s.positions is not None}
            for key, model in models.items()}


def _pivot_scores(scored, key, seed, s: SentenceSet) -> np.ndarray:
    return np.array([row[j] for row, j in zip(scored[key, seed][s.name], s.positions)])


def _seeds(scored, key) -> list[int]:
    return sorted(seed for k, seed in scored if k == key)


def heat_table(scored: _Scored, s: SentenceSet, methods: Iterable[str]) -> pd.DataFrame:
    """Every token's normalized score in every sentence of ``s``, per method and seed (tidy)."""
    return pd.DataFrame([{"method": key, "seed": seed, "sentence": i + 1, "position": j, "token": token,
                          "score": float(scored[key, seed][s.name][i][j]), "pivot": bool(j == s.positions[i])}
                         for key in methods for seed in _seeds(scored, key) for i, ids in enumerate(s.ids)
                         for j, token in enumerate(tokens(ids))])


def win_table(scored: _Scored, sets: Mapping[str, SentenceSet], pairs: Sequence[int]) -> pd.DataFrame:
    """Per set with pivots, seed pair and sentence: whether ℓ1.1's pivot score beats GD's (``wins`` 1),
    falls below it (``losses`` 1) or ties (``ties`` 1; ``analysis.win_loss_tie``'s tolerance)."""
    rows = []
    for name, s in sets.items():
        if s.positions is None:
            continue
        for seed in pairs:
            first, second = (_pivot_scores(scored, key, seed, s) for key in estimates.COMPARED)
            for i, (a, b) in enumerate(zip(first, second)):
                w, l, t = analysis.win_loss_tie(a[None], b[None])
                rows.append({"sentences": s.title, "set": name, "seed": seed, "sentence": i, "wins": w, "losses": l,
                             "ties": t})
    return pd.DataFrame(rows)


def seed_counts(outcomes: pd.DataFrame) -> pd.DataFrame:
    """``win_table``'s outcomes summed per set and seed pair: wins, losses and ties."""
    return outcomes.groupby(["sentences", "set", "seed"], sort=False)[["wins", "losses", "ties"]].sum().reset_index()


def _most_attended(rows) -> np.ndarray:
    """The position of each sentence's highest-scored token, [CLS] and [SEP] excluded."""
    return np.array([1 + int(np.argmax(r[1:-1])) for r in rows])


def summary(outcomes: pd.DataFrame, scored: _Scored, sets: Mapping[str, SentenceSet],
            methods: Sequence[str]) -> pd.DataFrame:
    """One row per set with pivots (and the paper's): the counts, ℓ1.1's win rate as the mean of the
    per-seed rates with its interval over seeds and sentences (``estimates.win_rate``; ``low``, ``high``)
    and over seeds only (``seeds_low``, ``seeds_high``), the pooled rate with a Wilson interval (which
    wrongly treats every comparison as independent; shown for contrast), and per method the mean pivot
    score and how often the pivot is the most-attended token. ``outcomes``: ``win_table``."""
    rows = []
    for name, part in outcomes.groupby("set", sort=False):
        s = sets[name]
        wins, losses, ties = (int(part[c].sum()) for c in ("wins", "losses", "ties"))
        rate = estimates.win_rate(part)
        pooled_low, pooled_high = wilson_interval(wins, wins + losses) if wins + losses else (np.nan, np.nan)
        row = {"key": name, "sentences": s.title, "n": len(s.ids), "seeds": part.seed.nunique(), "wins": wins,
               "losses": losses, "ties": ties, "rate": rate.value, "low": rate.low, "high": rate.high,
               "seeds_low": rate.seeds_low, "seeds_high": rate.seeds_high,
               "pooled": wins / (wins + losses) if wins + losses else np.nan, "pooled_low": pooled_low,
               "pooled_high": pooled_high}
        for key in methods:  # every seed of the method (l3 may have fewer)
            row[f"score_{key}"] = float(np.mean([_pivot_scores(scored, key, seed, s).mean()
                                                 for seed in _seeds(scored, key)]))
            row[f"top1_{key}"] = float(np.mean([np.mean(_most_attended(scored[key, seed][name]) == s.positions)
                                                for seed in _seeds(scored, key)]))
        rows.append(row)
    p = paper.TOKEN_SELECTION
    rows.append({"key": "paper", "sentences": "paper (40 machine-written, 1 model each)", "n": p["sentences"],
                 "seeds": 1, "wins": p["wins"], "losses": p["losses"], "ties": p["ties"],
                 "pooled": paper.token_win_rate(), "score_1.1": p["score_1.1"],
                 "score_2": p["score_2"]})
    return pd.DataFrame(rows)


def _percent(x) -> str:
    return estimates.number_text(x, 1, 100, sign=False, suffix="%", missing="–")


def _bounds(low, high) -> str:
    """"[40.1%, 62.0%]"; "–" without an interval."""
    return "–" if pd.isna(low) else f"[{_percent(low)}, {_percent(high)}]"


def _interval(rate, low, high) -> str:
    """"51.2% [40.1%, 62.0%]"; "–" for no rate, no brackets without an interval."""
    return _percent(rate) + ("" if pd.isna(low) else f" {_bounds(low, high)}")


def summary_view(table: pd.DataFrame) -> pd.DataFrame:
    """``summary`` as the book shows it."""
    methods = [c.removeprefix("score_") for c in table.columns if c.startswith("score_")]
    return pd.DataFrame({
        "sentences": table.sentences, "sentences × seeds": [f"{n} × {k}" for n, k in zip(table.n, table.seeds)],
        "ℓ1.1 / GD wins / ties": [f"{w} / {l} / {t}" for w, l, t in zip(table.wins, table.losses, table.ties)],
        "ℓ1.1 win rate, per-seed mean [95 %, seeds and sentences]": [_interval(r, a, b) for r, a, b in
                                                                    zip(table.rate, table.low, table.high)],
        "[95 % t, seeds only]": [_bounds(a, b) for a, b in zip(table.seeds_low, table.seeds_high)],
        "pooled [Wilson, as if independent]": [_interval(r, a, b) for r, a, b in
                                               zip(table.pooled, table.pooled_low, table.pooled_high)]}
        | {f"pivot score {key_text(k)}": table[f"score_{k}"].map(
            lambda v: "–" if pd.isna(v) else f"{v:.2f}") for k in methods})


def summary_text(row: pd.Series) -> str:
    """One set's row of ``summary`` in words."""
    scores = " / ".join(f"{row[f'score_{k}']:.2f}" for k in estimates.COMPARED if f"score_{k}" in row)
    return (f"ℓ1.1 / GD / ties {row.wins} / {row.losses} / {row.ties} over {row.seeds} seed pairs; ℓ1.1's win rate "
            f"{_interval(row.rate, row.low, row.high)} (mean of the per-seed rates, 95 % interval over seeds and "
            f"sentences; over seeds only {_bounds(row.seeds_low, row.seeds_high)}; "
            f"pooled as if independent: {_interval(row.pooled, row.pooled_low, row.pooled_high)}); mean pivot "
            f"scores {scores} (ℓ1.1 / GD)")


def concentration_table(models: Mapping[tuple[str, int], torch.nn.Module], s: SentenceSet,
                        batch_size: int = 256) -> pd.DataFrame:
    """Per model: the mean over the sentences of ``s`` of the [CLS] row's normalized entropy and top share
    (``analysis.concentration``)."""
    rows = []
    for (key, seed), model in models.items():
        values = []
        for batch in length_batches(s.ids, batch_size):
            chunk = [s.ids[i] for i in batch]
            row = analysis.cls_row(model, *pad(chunk)).double().numpy()
            values += [analysis.concentration(r[:len(ids)]) for r, ids in zip(row, chunk)]
        entropy, top = np.mean(values, axis=0)
        rows.append({"method": key, "seed": seed, "entropy": float(entropy), "top_share": float(top),
                     "sentences": len(s.ids)})
    return pd.DataFrame(rows)


def concentration_text(table: pd.DataFrame, methods: Sequence[str], pairs: Sequence[int]) -> str:
    """The concentration per method (means over seeds with t intervals) and GD minus ℓ1.1, paired."""
    parts = []
    for key in methods:
        part = table[table.method == key]
        m, lo, hi = mean_interval(part.entropy)
        parts.append(f"{key_text(key)}: normalized entropy {m:.3f}"
                     + ("" if lo != lo else f" [{lo:.3f}, {hi:.3f}]") + f", top-token share {part.top_share.mean():.3f}")
    text = "Mean over the test sentences, then over seeds (95 % t interval): " + "; ".join(parts) + "."
    if set(estimates.COMPARED) <= set(methods) and len(pairs) >= 1:
        gap = estimates.entropy_gap(table[table.seed.isin(pairs)])
        text += f" GD minus ℓ1.1 in normalized entropy, seed by seed: {gap.text(3)} (positive: ℓ1.1's attention is sharper)."
    return text


def deletion_table(models: Mapping[tuple[str, int], torch.nn.Module], scored: _Scored, s: SentenceSet,
                   seed: int = 0) -> pd.DataFrame:
    """Per model: the mean drop of the predicted class's probability when deleting, from each sentence
    of ``s``, its most-attended token, its pivot, or a random real token (seeded)."""
    rng = np.random.default_rng(seed)
    random = np.array([rng.integers(1, len(x) - 1) for x in s.ids])  # a real token, not [CLS]/[SEP]
    rows = []
    for (key, model_seed), model in models.items():
        attended = _most_attended(scored[key, model_seed][s.name])
        for target, positions in (("most attended", attended), ("lexicon pivot", s.positions), ("random token", random)):
            rows.append({"method": key, "seed": model_seed, "deleted": target,
                         "drop": float(deletion_drops(model, s.ids, positions).mean())})
    return pd.DataFrame(rows)


def deletion_text(drops: pd.DataFrame, methods: Sequence[str]) -> str:
    means = drops.groupby(["deleted", "method"], sort=False)["drop"].mean()
    return "; ".join(f"deleting the {target}: " + " / ".join(f"{means[target, k]:.3f}" for k in methods)
                     for target in dict.fromkeys(drops.deleted)) + " (" + " / ".join(
        key_text(k) for k in methods) + ")"


def gate_text(grid: "sentiment.Grid", depth: int) -> str:
    """Whether the compared models are in the claim's regime: stop rule and test accuracy against the
    bag-of-words baseline's floor (``stats.generalization_floor``)."""
    runs = grid.runs[grid.runs.chosen & (grid.runs.layers == depth) & grid.runs.method.isin(estimates.COMPARED)]
    c = grid.config
    nb = sentiment.baseline(c.dataset, 0, c.max_length, c.train_size).set_index("baseline").test_accuracy
    floor = generalization_floor(float(nb["naive_bayes"]))
    parts = [f"{key_text(k)}: {int(r.reached.sum())} of {len(r)} runs reached the stop rule, "
             f"test accuracy {r.last_test.mean():.1%}" for k, r in runs.groupby("method", sort=False)]
    return "; ".join(parts) + f" (baseline {nb['naive_bayes']:.1%}, so the floor is {floor:.1%})"
