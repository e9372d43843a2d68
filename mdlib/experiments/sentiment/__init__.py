"""Chapter 04's experiments, which chapters 05 and 06 read too: sentiment classification by a small
transformer encoder, trained by l_p mirror descent and its baselines. A module per job:

- ``tokens``: the WordPiece-tokenized splits, a seeded training subset, and their batches;
- ``run``: one training run (kind ``e4-sentiment``): its config, model and optimizer, nothing else;
- ``grids``: Table 1's grids (kind ``e4-grid``): a step-size sweep, the choice on validation, every seed
  at the chosen steps; the runs and grids read back;
- ``bag_of_words``: the bag-of-words baselines (kind ``e4-baseline``);
- ``allocation``: the 2 x 2 of geometry and per-tensor step (kind ``e4-arms``) and the effective steps;
- ``chapter``: what chapter 04 trains, and its long part (the embedding-scale series and the 2 x 2s),
  built or as committed under ``data/``;
- ``pilot_tables``: the pilots that sized the chapter, as committed.

The names of ``tokens``, ``run``, ``grids``, ``bag_of_words`` and ``pilot_tables`` are the package's own
(``sentiment.grid(config)``); ``allocation`` and ``chapter`` are imported as modules.
"""

from mdlib.experiments.sentiment.tokens import (TokenizedDataset, by_length, collate, encode, splits, tokenizer,
                                                training_subset)
from mdlib.experiments.sentiment.run import KIND, SentimentRun, TextModel, build, initial_model, run_config
from mdlib.experiments.sentiment.grids import (ADAM_STEP, GRIDS, GRID_KIND, Grid, PAPER_STEP_SIZES, SWEEP_SEEDS,
                                               SentimentGrid, built_config, built_grid, cell_table, chapter_grids,
                                               chapter_runs, choose, grid, grid_name, movement, predictions,
                                               reference_step, run_row, seeds_of, stored_correct, sweep, test_correct,
                                               train_grids, train_runs, trained_model)
from mdlib.experiments.sentiment.bag_of_words import BASELINES, BASELINE_C, BASELINE_KIND, baseline
from mdlib.experiments.sentiment.pilot_tables import authors_pilots, pilots

__all__ = ["ADAM_STEP", "BASELINES", "BASELINE_C", "BASELINE_KIND", "GRIDS", "GRID_KIND", "Grid", "KIND",
           "PAPER_STEP_SIZES", "SWEEP_SEEDS", "SentimentGrid", "SentimentRun", "TextModel", "TokenizedDataset",
           "authors_pilots", "baseline", "build", "built_config", "built_grid", "by_length", "cell_table",
           "chapter_grids", "chapter_runs", "choose", "collate", "encode", "grid", "grid_name", "initial_model",
           "movement", "pilots", "predictions", "reference_step", "run_config", "run_row", "seeds_of", "splits",
           "stored_correct", "sweep", "test_correct", "tokenizer", "train_grids", "train_runs", "trained_model",
           "training_subset"]
