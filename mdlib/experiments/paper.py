"""Every number this project takes from the paper or from the authors' public code, in one place.

Julistiono, Tarzanagh and Azizan, *Optimizing Attention with Mirror Descent* (arXiv:2410.14581), and
the ``real-data/`` folder of the authors' code. Each constant names its source: a section, table or
figure of the paper, or "the authors' code" (a value the paper does not state, read from their
scripts and notebooks). The experiments read their step sizes and epochs to stop from here, the
chapters and the scorecard read the reported results from here; nothing else types them.

Method keys are those of ``mdlib.experiments.methods``: "1.1", "2" (gradient descent), "3" for
ℓp mirror descent, "adam". This module imports nothing heavy (the scorecard reads it without torch).
"""

from __future__ import annotations

from typing import Mapping

from mdlib.experiments import methods
from mdlib.experiments.methods import ADAM, GD, L1_1, L3

__all__ = ["CLAIMS", "E1_SEEDS", "E1_PLATEAU", "E1_STEPS", "SETUP_NAMES", "STOP_TRAIN_ACCURACY", "TABLE_1", "TABLE_1_GAPS", "TABLE_1_STD", "EPOCHS_TO_STOP", "RERUN_6_LAYERS",
           "SENTIMENT_STEP_SIZES", "TOKEN_SELECTION", "WEIGHT_THRESHOLD", "KQV_WIDTH", "KQV_ABOVE", "KQV_ENTRIES",
           "VIT_STEP_SIZES", "VIT_ACCURACY", "VIT_EPOCHS", "VIT_IMAGE_SIZE", "VIT_MODEL", "VIT_WIDTH", "OPS_PER_PARAMETER", "VIT_HOURS", "ARTIFACTS",
           "table1_rows", "token_win_rate", "quotes"]

# --- the synthetic paths (Figure 4) -----------------------------------------------------------------

#: Figure 4: the seeds (random instances) of each path.
E1_SEEDS = 100
#: Figure 4: where the divergence to the other exponents' SVM directions levels off on the p = 3 path.
E1_PLATEAU = 0.2
#: Figure 4 (section on the synthetic experiments): normalized mirror-descent steps of each path, by p.
E1_STEPS: Mapping[float, int] = {1.75: 1500, 2.0: 2000, 3.0: 20000}

# --- Table 1: IMDb sentiment, encoder classifier with L layers and L heads -------------------------

#: The stop rule of the sentiment runs (the paper's E4): training ends at the first epoch whose running
#: training accuracy (dropout on) reaches it.
STOP_TRAIN_ACCURACY = 0.995

#: Table 1: best test accuracy over epochs (%), mean of the authors' runs: layers -> method -> value.
#: How the book names the sentiment models' setups (``mdlib.models.SETUPS``): the authors' and the
#: variations of it.
SETUP_NAMES: Mapping[str, str] = {"authors": "the authors' setup", "small-embeddings": "small embeddings N(0, 0.02²)",
                                  "modern": "modern initialization"}

TABLE_1: Mapping[int, Mapping[str, float]] = {3: {L1_1: 83.47, GD: 81.66, L3: 82.57},
                                              4: {L1_1: 83.36, GD: 81.05, L3: 82.40},
                                              6: {L1_1: 83.65, GD: 82.23, L3: 81.98}}
#: Table 1's reported ℓ1.1 minus GD gaps (points) by layers, as the paper states them (rounded from
#: unrounded means, so 6 layers reads 1.43, not 83.65 - 82.23).
TABLE_1_GAPS: Mapping[int, float] = {3: 1.81, 4: 2.31, 6: 1.43}
#: Table 1's standard deviations over runs: between these two values, in points, for every cell.
TABLE_1_STD: tuple[float, float] = (0.1, 0.2)
#: The authors' code (their test_acc notebook): epochs to the stop rule, mean of 10 runs: layers -> method -> epochs.
EPOCHS_TO_STOP: Mapping[int, Mapping[str, int]] = {3: {L1_1: 72, GD: 80, L3: 162},
                                                   4: {L1_1: 87, GD: 88, L3: 135},
                                                   6: {L1_1: 150, GD: 58, L3: 95}}
#: The authors' code (the same notebook): its re-run's best test accuracies (%) at 6 layers, by method.
RERUN_6_LAYERS: Mapping[str, float] = {L1_1: 82.57, GD: 81.03, L3: 80.65}
#: Section 5 (sentiment experiment): the step sizes for IMDb: layers -> method -> lr (for the summed loss).
SENTIMENT_STEP_SIZES: Mapping[int, Mapping[str, float]] = {3: {L1_1: 8e-4, GD: 4e-4, L3: 4e-6},
                                                           4: {L1_1: 6e-4, GD: 4e-4, L3: 6e-6},
                                                           6: {L1_1: 1e-3, GD: 1e-3, L3: 1e-5}}

# --- token selection (Figures 8, 13, 14): one 6-layer model per optimizer --------------------------

#: Figures 8, 13, 14: sentences where ℓ1.1's model puts more [CLS] attention on the pivotal word
#: ("wins"), fewer ("losses"), the same ("ties"), of ``sentences``; the mean normalized score of the
#: pivotal token per method.
TOKEN_SELECTION: Mapping[str, float] = {"wins": 22, "losses": 16, "ties": 2, "sentences": 40,
                                        "score_1.1": 0.44, "score_2": 0.31}

# --- weights (Figure 9; Figure 12 for the vision transformer) -------------------------------------

#: Figures 9 and 12: the |w| threshold of the weight histograms and counts.
WEIGHT_THRESHOLD = 0.06
#: Figure 9: the width of the IMDb encoders whose weights it counts (their K, Q, V are 384 x 384).
KQV_WIDTH = 384
#: Figure 9: entries of the key, query and value matrices above ``WEIGHT_THRESHOLD`` in the 6-layer
#: IMDb models: method -> (K, Q, V).
KQV_ABOVE: Mapping[str, tuple[int, int, int]] = {L1_1: (18206, 13964, 7643), GD: (27224, 14654, 10127)}
#: Figure 9: entries of each of K, Q, V in those models (6 layers of 384 x 384).
KQV_ENTRIES = 6 * KQV_WIDTH * KQV_WIDTH

# --- the vision transformer (Figures 10-12) --------------------------------------------------------

#: Step sizes by method: Adam's (section 5) and ℓ1.1's (the authors' code, their only MD script).
VIT_STEP_SIZES: Mapping[str, float] = {ADAM: 1e-4, L1_1: 5e-2}
#: Figures 10, 11: final test accuracy (%), about the same for Adam and every MD exponent.
VIT_ACCURACY: Mapping[str, float] = {"cifar10": 82.0, "cifar100": 55.0}
#: Figures 10, 11: the epochs of every vision run.
VIT_EPOCHS = 2000
#: The paper's vision transformer on CIFAR (Appendix G; the authors' code): its ``VisionTransformer``
#: arguments but the channels and classes, and the size its images are resized to.
VIT_MODEL: Mapping[str, int | float] = {"patch": 4, "width": 512, "depth": 6, "heads": 8, "mlp": 512, "dropout": 0.1,
                                        "embedding_dropout": 0.1}
VIT_IMAGE_SIZE = 48
#: Figure 12: the width of the vision transformer whose weights it counts (the paper's ViT, on CIFAR).
VIT_WIDTH = VIT_MODEL["width"]

# --- cost (Appendix G) -----------------------------------------------------------------------------

#: Appendix G.1: operations per parameter of one update, by optimizer family.
OPS_PER_PARAMETER: Mapping[str, int] = {"GD": 2, "MD": 10, "Adam": 14}
#: Appendix G.7: hours per optimizer for ``VIT_EPOCHS`` epochs on one V100 GPU, by data set.
VIT_HOURS: Mapping[str, float] = {"cifar10": 29, "cifar100": 25}

# --- which figure or table of the paper each book label reproduces ---------------------------------

#: The figure or table of the paper each results label reproduces; None: an analysis the paper has not.
ARTIFACTS: Mapping[str, str | None] = {
    # 01: fixed-decoder paths
    "fig-e1-paths": "Figure 4",
    "table-e1-final": None,
    "fig-e1-stall": None,
    # 02: one instance as a 2-D path (the paper's figure of it)
    "fig-e2-path": "E2: single-instance 2-D path figure",
    "fig-e2-norm-growth": None,
    # 03: joint training
    "fig-e3-joint": "E3: joint-training figure (probabilities)",
    "fig-e3-joint-W": "E3: joint-training figure (W against the attention SVM)",
    "fig-e3-joint-v": "E3: joint-training figure (v against the decoder SVM)",
    "table-e3-final": None,
    # 04: sentiment
    "table-sentiment-steps": None,
    "table-1": "Table 1",
    "table-1-variation": "Table 1 (a variation: small embeddings)",
    "table-sentiment-runs": "Table 1 (per run)",
    "fig-sentiment-curves": None,
    "fig-sentiment-curves-variation": None,
    "table-sentiment-baseline": None,
    "fig-sentiment-movement": None,
    "fig-sentiment-movement-variation": None,
    "table-sentiment-batching": None,
    "table-sentiment-predictions": "Table 1 (per run and test sentence)",
    "table-sentiment-effective-steps": None,
    "table-sentiment-allocation": None,
    "table-sentiment-contrasts": None,
    "table-sentiment-tied": None,
    "table-sentiment-tied-2x2": None,
    "fig-sentiment-scale-series": None,
    "table-sentiment-series": None,
    "table-sentiment-overnight-runs": None,
    "table-sentiment-overnight-predictions": None,
    # 05: token selection
    "fig-token-attention": "Figures 8, 13, 14",
    "table-token-selection": "Figures 8, 13, 14 (wins and mean scores)",
    "table-token-selection-seeds": "Figures 8, 13, 14 (wins per seed pair)",
    "table-token-selection-sentences": "Figures 8, 13, 14 (per seed pair and sentence)",
    "table-token-concentration": None,
    "fig-token-concentration": None,
    "fig-token-intervention": None,
    # 06: weights
    "table-weights-kqv": f"Figure 9 (entries above {WEIGHT_THRESHOLD:g})",
    "fig-weights-kqv": "Figure 9",
    "table-weights-change": None,
    "fig-pruning": None,
    # 07: vision transformer
    "table-vit-sweep": None,
    "fig-vit-accuracy": "Figures 10, 11",
    "table-vit": "Figures 10, 11 (final test accuracy)",
    "fig-vit-weights": "Figure 12",
    "table-vit-change": None,
    "table-vit-diverged": None,
    "fig-vit-pruning": None,
    # 08: cost
    "fig-cost-step": None,
    "table-cost-training": None,
    "table-cost": "Appendix G.1 (operations per parameter)",
    "table-cost-vit": "Appendix G.7 (training time)",
    # 09: a guide to step sizes (no claim of the paper's)
    "table-steps-first-step": None,
    "fig-steps-sweep": None,
    "table-steps-best": None,
    "table-steps-movement": None,
}


def table1_rows() -> list[dict[str, float]]:
    """Table 1 as rows ``{"layers": L, "1.1": ..., "2": ..., "3": ..., "gap": TABLE_1_GAPS[L]}``, by layers."""
    return [{"layers": L, **TABLE_1[L], "gap": TABLE_1_GAPS[L]} for L in sorted(TABLE_1)]


def token_win_rate() -> float:
    """ℓ1.1's share of the non-tied sentences in the paper's count: wins / (wins + losses)."""
    t = TOKEN_SELECTION
    return t["wins"] / (t["wins"] + t["losses"])


def _per_method(values: Mapping[int, Mapping[str, float]], fmt: str = "{}") -> str:
    """"ℓ1.1 a / b / c, ..." over the layers, one group per method of Table 1 (its keys "1.1", "2", "3")."""
    keys = list(values[min(values)])
    return ", ".join(f"{methods.key_text(key)} "
                     + " / ".join(fmt.format(values[L][key]) for L in sorted(values)) for key in keys)


def quotes() -> dict[str, str]:
    """The paper's numbers as the chapters quote them in their prose (glued text, never typed):
    name -> text. Names start with ``paper-``."""
    t, k = TOKEN_SELECTION, KQV_ABOVE
    return {
        "paper-t1-std": f"{TABLE_1_STD[0]:g}-{TABLE_1_STD[1]:g}",
        "paper-t1-gaps": " / ".join(f"+{TABLE_1_GAPS[L]:.2f}" for L in sorted(TABLE_1_GAPS)),
        "paper-t1-layers": " / ".join(str(L) for L in sorted(TABLE_1)),
        "paper-epochs": _per_method(EPOCHS_TO_STOP),
        "paper-rerun": " / ".join(f"{value:.2f}" for value in RERUN_6_LAYERS.values())
        + f" ({' / '.join(methods.key_text(key) for key in RERUN_6_LAYERS)})",
        "paper-tokens": f"ℓ1.1 wins {t['wins']} of {t['sentences']} sentences, GD {t['losses']}, {t['ties']} ties",
        "paper-token-counts": f"{t['wins']} / {t['losses']} / {t['ties']}",
        "paper-token-scores": f"{t['score_1.1']:.2f} / {t['score_2']:.2f} (ℓ1.1 / GD)",
        "paper-kqv": (f"{' / '.join(f'{n:,}' for n in k[L1_1])} (K / Q / V) for ℓ1.1 against "
                      f"{' / '.join(f'{n:,}' for n in k[GD])} for GD, out of {KQV_ENTRIES:,} entries each"),
        "paper-threshold": f"{WEIGHT_THRESHOLD:g}",
        "paper-vit": (f"about {VIT_ACCURACY['cifar10']:.0f} % test accuracy on CIFAR-10 and about "
                      f"{VIT_ACCURACY['cifar100']:.0f} % on CIFAR-100"),
        "paper-vit-epochs": f"{VIT_EPOCHS}",
        "paper-ops": (f"{OPS_PER_PARAMETER['GD']} operations per parameter for gradient descent, "
                      f"{OPS_PER_PARAMETER['MD']} for mirror descent and {OPS_PER_PARAMETER['Adam']} for Adam"),
        "paper-hours-cifar10": f"{VIT_HOURS['cifar10']:g} hours (CIFAR-10)",
        "paper-hours": (f"about {VIT_HOURS['cifar10']:g} hours (CIFAR-10) and {VIT_HOURS['cifar100']:g} hours "
                        f"(CIFAR-100) for {VIT_EPOCHS} epochs"),
    }


def _claims() -> dict[str, str]:
    """The paper's side of the scorecard's claims that quote its numbers, by the claim's figure or table."""
    table1 = ", ".join(f"{' / '.join(f'{row[k]:.2f}' for k in methods.PAPER_PS)} (L = {row['layers']})"
                       for row in table1_rows())
    gaps = " / ".join(f"{row['gap']:.2f}" for row in table1_rows())
    t, kqv = TOKEN_SELECTION, {key: " / ".join(map(str, KQV_ABOVE[key])) for key in (L1_1, GD)}
    return {
        "table-1": f"{table1}; ℓ1.1 − GD {gaps} (best over epochs)",
        "table-token-selection": (f"ℓ1.1 wins {t['wins']} of {t['sentences']}, GD {t['losses']}, {t['ties']} ties "
                                  f"({100 * token_win_rate():.1f} % of non-ties); one model each"),
        "table-weights-change": f"entries > {WEIGHT_THRESHOLD:g}, K / Q / V: {kqv[L1_1]} (ℓ1.1) vs {kqv[GD]} (GD)",
        "table-vit": ", ".join(f"≈ {accuracy:.0f} % ({methods.dataset_text(name)})"
                               for name, accuracy in VIT_ACCURACY.items()) + " for Adam and every MD exponent",
        "table-cost-training": (f"ops per parameter {', '.join(f'{name} {n}' for name, n in OPS_PER_PARAMETER.items())}; "
                                "small time differences between the five methods"),
    }


#: The paper's side of the scorecard's claims that quote its numbers, by the claim's figure or table.
CLAIMS = _claims()
