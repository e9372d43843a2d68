"""What training runs cost before they run: epochs, steps and floating-point work of each run config,
from the config alone (no data is read, nothing is trained), and the distinct runs of a chapter's grids.

A run's work is counted in matrix-multiply FLOPs of the transformer it trains. One example's forward
pass through ``L`` layers of width ``d``, MLP width ``m`` and ``n`` tokens costs

    L (8 n d^2 + 4 n d m + 4 n^2 d)         (Q, K, V and output projections; MLP; scores and mixing)

plus the ViT's patch embedding ``2 (n - 1) C P^2 d``; a training step costs three forward passes
(forward, and the backward's two products per matrix), an evaluation one. Embedding lookups,
normalizations, softmax and the optimizer's update are left out (a few per cent at these widths).

A sentiment run's examples have at most ``max_length`` tokens (batches are padded to their longest
text): its count is an upper bound where the mean length is not recorded in :data:`MEAN_TOKENS`.
A sentiment run ends at the stop rule or at ``epochs``; where the paper's authors measured the mean
epochs to the stop rule for the same setting (``paper.EPOCHS_TO_STOP``: IMDb, their initialization,
the paper's step sizes, width 384, 512 tokens, the whole training split), that is the expected
length, else the cap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping

from mdlib.experiments import paper, step_grid
from mdlib.experiments.methods import method_key
from mdlib.runs import identity

if TYPE_CHECKING:
    from mdlib.experiments.sentiment import SentimentRun
    from mdlib.experiments.vision import VisionRun

__all__ = ["SPLITS", "MEAN_TOKENS", "RunWork", "encoder_flops", "grid_runs", "run_work", "sentiment_work",
           "vision_work"]

#: Examples per split of each data set, as the readers of ``mdlib.experiments.data`` make them:
#: (train, validation, test). Rotten Tomatoes: the 10,568 snippets with a non-zero rating, split
#: 80 / 10 / 10; IMDb: 25,000 training reviews less a 10 % validation share, 25,000 test reviews;
#: the image sets' training images (their validation images are cut from these per run).
SPLITS: Mapping[str, tuple[int, int, int]] = {
    "rotten_tomatoes": (8455, 1056, 1057), "imdb": (22500, 2500, 25000),
    "fashion_mnist": (60000, 0, 10000), "cifar10": (50000, 0, 10000), "cifar100": (50000, 0, 10000)}

#: Mean WordPiece tokens per text ([CLS] and [SEP] included) after truncation at ``max_length``,
#: measured on the training split: dataset -> {max_length: mean}.
MEAN_TOKENS: Mapping[str, Mapping[int, float]] = {"rotten_tomatoes": {64: 26.89}}


@dataclass(frozen=True)
class RunWork:
    """One run's work: ``epochs`` expected (``epochs_cap`` at most; ``expected_from``: where the
    expectation comes from; ``bound``: the expectation is only the cap of a run that a stop rule may
    end sooner), training ``steps_per_epoch``, evaluated examples per epoch (averaged over the
    epochs), and the forward FLOPs of one training and one evaluated example."""

    epochs: float
    epochs_cap: int
    expected_from: str
    bound: bool
    steps_per_epoch: int
    batch_size: int
    eval_examples_per_epoch: float
    forward_flops: float
    eval_forward_flops: float
    tokens_bound: bool

    def flops(self, epochs: float | None = None) -> float:
        """The run's FLOPs over ``epochs`` (default: the expected epochs): training steps at three
        forward passes each, evaluations at one."""
        epochs = self.epochs if epochs is None else epochs
        train = 3 * self.forward_flops * self.batch_size * self.steps_per_epoch
        return epochs * (train + self.eval_forward_flops * self.eval_examples_per_epoch)

    def steps(self, epochs: float | None = None) -> float:
        return (self.epochs if epochs is None else epochs) * self.steps_per_epoch


def encoder_flops(tokens: float, width: int, mlp: int, layers: int) -> float:
    """Forward FLOPs of one example through the encoder layers (the module docstring's formula)."""
    return layers * (8 * tokens * width ** 2 + 4 * tokens * width * mlp + 4 * tokens ** 2 * width)


def _train_examples(dataset: str, train_size: int | None, held_out: int = 0) -> int:
    available = SPLITS[dataset][0] - held_out
    return available if not train_size else min(int(train_size), available)


def sentiment_work(config: SentimentRun) -> RunWork:
    """The work of a sentiment run config (``sentiment.run_config``): every epoch trains on the
    training (sub)set and evaluates the test split; the validation split once, at the end."""
    model, fit, spec = config.model, config.fit, config.optimizer
    dataset, length = config.dataset, config.max_length
    mean = MEAN_TOKENS.get(dataset, {}).get(length)
    tokens = mean if mean is not None else length
    examples = _train_examples(dataset, config.train_size)
    flops = encoder_flops(tokens, model.width, model.mlp, model.layers)
    cap = int(fit.epochs)
    key = method_key(spec.name, spec.p)
    authors = paper.EPOCHS_TO_STOP.get(model.layers, {}).get(key)
    paper_step = paper.SENTIMENT_STEP_SIZES.get(model.layers, {}).get(key)
    measured = (authors is not None and dataset == "imdb" and model.setup == "authors" and model.width == 384
                and length == 512 and config.train_size is None and math.isclose(spec.lr, paper_step))
    if measured:
        epochs, source = float(min(authors, cap)), "the authors' mean epochs to the stop rule"
    else:
        epochs, source = float(cap), "at most the epoch cap (no measured epochs to the stop rule for this setting)"
    _, validation, test = SPLITS[dataset]
    return RunWork(epochs, cap, source, not measured, math.ceil(examples / fit.batch_size), fit.batch_size,
                   test + validation / epochs, flops, flops, mean is None)


def vision_work(config: VisionRun) -> RunWork:
    """The work of a vision run config (``vision.run_config``): ``epochs`` epochs on the training
    images less the held-out validation ones, evaluating the validation images (a sweep run) or the
    test set every ``eval_every`` epochs and after the last."""
    part, model, fit = config.data, config.model, config.fit
    channels, _, native = {"fashion_mnist": (1, 10, 28), "cifar10": (3, 10, 32), "cifar100": (3, 100, 32)}[part.dataset]
    size, patch = part.image_size, model.patch
    tokens = (size // patch) ** 2 + 1
    flops = (encoder_flops(tokens, model.width, model.mlp, model.depth)
             + 2 * (tokens - 1) * channels * patch ** 2 * model.width)
    examples = _train_examples(part.dataset, part.train_size, part.validation)
    epochs = int(fit.epochs)
    evaluated = part.validation or SPLITS[part.dataset][2]
    evaluations = len(set(range(fit.eval_every, epochs + 1, fit.eval_every)) | {epochs})
    return RunWork(float(epochs), epochs, "a fixed number of epochs", False, math.ceil(examples / fit.batch_size),
                   fit.batch_size, evaluated * evaluations / epochs, flops, flops, False)


_WORK = {"e4-sentiment": sentiment_work, "e7-vit": vision_work}


def run_work(kind: str, config: identity.Config) -> RunWork:
    """The work of a run of ``kind`` (a sentiment or vision run)."""
    if kind not in _WORK:
        raise ValueError(f"no work model for runs of kind {kind!r}; known: {', '.join(_WORK)}")
    return _WORK[kind](config)


def grid_runs(designs: Iterable[step_grid.Design]) -> dict[str, tuple[str, identity.Config]]:
    """The distinct runs the grids train, by store key: ``{key: (kind, config)}``. A sweep run that is
    also a final run counts once, as ``grid.build`` trains it once; the count does not depend on
    which candidate the sweep chooses (every candidate's sweep seeds are trained, and the finals
    add the other seeds), so the first candidate stands in for the choice; with ``tied_finals`` every
    candidate counts as tied (at most). Candidates a grid grows are not counted."""
    found: dict[str, tuple[str, identity.Config]] = {}
    for design in designs:
        candidates = {cell: list(design.candidates(cell)) for cell in design.cells}
        chosen = {cell: step_grid.Choice(values[0], tuple(values) if design.tied_finals else (values[0],), values[0])
                  for cell, values in candidates.items()}
        items = [(design.sweep_config, item) for item in design.sweep_items()]
        items += [(design.final_config, item) for item in design.final_items(chosen)]
        for make, item in items:
            config = make(*item)
            found.setdefault(identity.config_key(design.run_kind, config), (design.run_kind, config))
    return found
