"""What a profile costs (``mdlib.book.plan``, ``mdlib.experiments.workload``): the runs it counts are
the runs the grids train, its FLOPs are torch's count, its GPU rate is the paper's, and the command
runs with nothing but the checkout (no data, no apt)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mdlib.book import chapters, epochs as known_epochs, plan, profiles, steptimes
from mdlib.experiments import methods, paper, paths, sentiment, vision, workload
from mdlib.experiments.sentiment import grids
from mdlib.models import EncoderClassifier, VisionTransformer
from mdlib.runs import identity
from test_step_grid import FakeRuns, SENTIMENT, fake_correct, multiple_of, key_of, sentiment_config  # tests/test_step_grid.py

ROOT = Path(__file__).resolve().parents[1]


def _forward_flops(model, *inputs) -> int:
    """torch's count of the FLOPs of one forward pass (matrix products and attention)."""
    model.eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(*inputs)
    return counter.get_total_flops()


@pytest.mark.parametrize("tokens, width, layers", [(16, 24, 3), (40, 48, 2)])
def test_the_encoder_flops_are_torchs_count(tokens, width, layers):
    model = EncoderClassifier(max_length=tokens, width=width, layers=layers, heads=layers, mlp=4 * width)
    ids = torch.randint(1000, 2000, (1, tokens))
    counted = _forward_flops(model, ids, torch.ones_like(ids))
    assert counted == pytest.approx(workload.encoder_flops(tokens, width, 4 * width, layers), rel=0.01)


def test_the_vision_flops_are_torchs_count():
    model = VisionTransformer(image_size=16, patch=4, channels=3, classes=10, width=32, depth=2, heads=4, mlp=48)
    counted = _forward_flops(model, torch.randn(1, 3, 16, 16))
    config = vision.run_config("cifar10", optimizer="adam", lr=1e-3, seed=0, epochs=1, image_size=16,
                               model=dict(patch=4, width=32, depth=2, heads=4, mlp=48, dropout=0.0, embedding_dropout=0.0))
    assert counted == pytest.approx(workload.vision_work(config).forward_flops, rel=0.01)


def test_the_gpu_rate_gives_back_the_papers_vit_hours():
    config = vision.run_config("cifar10", optimizer="adam", lr=1e-4, seed=0, epochs=paper.VIT_EPOCHS, image_size=48,
                               eval_every=paper.VIT_EPOCHS, model=dict(patch=4, width=512, depth=6, heads=8, mlp=512,
                                                                        dropout=0.1, embedding_dropout=0.1))
    work = workload.vision_work(config)
    train = 3 * work.forward_flops * work.batch_size * work.steps_per_epoch * work.epochs / 1e12
    assert work.steps_per_epoch == 500  # 50,000 images, batch 100
    assert train * plan.gpu_seconds_per_tflop() / 3600 == pytest.approx(paper.VIT_HOURS["cifar10"])


def test_a_sentiment_run_expects_the_authors_epochs_only_in_their_setting():
    paper_run = sentiment.run_config(layers=4, optimizer="md", p=1.1, lr=paper.SENTIMENT_STEP_SIZES[4]["1.1"],
                                     dataset="imdb", max_length=512, width=384, epochs=1000)
    work = workload.sentiment_work(paper_run)
    assert work.epochs == paper.EPOCHS_TO_STOP[4]["1.1"] and work.epochs_cap == 1000
    assert work.steps_per_epoch == 225 and work.tokens_bound  # 22,500 reviews, batch 100; 512 tokens a bound
    assert workload.sentiment_work(dataclasses.replace(paper_run, fit=dataclasses.replace(paper_run.fit, epochs=50))
                                   ).epochs == 50
    other_step = sentiment.run_config(layers=4, optimizer="md", p=1.1, lr=3 * paper.SENTIMENT_STEP_SIZES[4]["1.1"],
                                      dataset="imdb", max_length=512, width=384, epochs=1000)
    assert workload.sentiment_work(other_step).epochs == 1000


def test_the_counted_runs_are_the_runs_the_grid_trains(monkeypatch, tmp_path):
    monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path))
    table = {**SENTIMENT, ("1.1", 10): (1.0, 0.1, 0.1)}  # none diverges: every run is trained
    fake = FakeRuns(sentiment.KIND, lambda c: table[key_of(c), multiple_of(c)])
    monkeypatch.setattr(grids, "train_runs", fake)
    monkeypatch.setattr(grids, "test_correct", fake_correct)
    config = sentiment.SentimentGrid.of(sentiment_config())
    counted = workload.grid_runs([config.design()])
    sentiment.grid(config)
    trained = {identity.config_key(sentiment.KIND, c) for c in fake.trained}
    assert len(fake.trained) == len(trained) == len(counted) == 2 * (3 + 2) + 2  # candidates at seeds 0, 1; then seed 2
    sweep = {key for key, (_, c) in counted.items() if c.fit.seed < sentiment.SWEEP_SEEDS}  # every candidate
    assert sweep <= trained  # the finals differ only by which candidate the sweep chose


@pytest.mark.parametrize("profile", ["smoke", "default", "paper"])
def test_the_chapters_grids_are_the_configs_the_notebooks_built(profile):
    p = profiles.executed_parameters("04_sentiment", profile)
    table1, variation = sentiment.chapter_grids(**p)
    built = dict(dataset=p["dataset"], max_length=p["max_length"], train_size=p["train_size"], width=p["width"],
                 setup=p["setup"], epochs=p["epochs"], layers=p["layers"], methods=p["methods"], seeds=p["seeds"],
                 multiples=p["step_multiples"])
    assert table1.to_dict() == sentiment.SentimentGrid.of(built).to_dict()
    assert variation.to_dict() == sentiment.SentimentGrid.of(dict(
        built, layers=p["layers"][:1], methods=p["variation_methods"], seeds=p["variation_seeds"],
        epochs=p["variation_epochs"], multiples=p["variation_multiples"], setup=p["variation_setup"], grow=p["grow"],
        tied_finals=p["tied_finals"])).to_dict()
    v = profiles.executed_parameters("07_vision", profile)
    swept, at_paper = vision.chapter_grids(**v)
    vit_methods = [methods.ADAM] + [methods.method_key("md", float(x)) for x in v["ps"]]
    built = dict(datasets=v["datasets"], image_size=v["image_size"], train_size=v["train_size"],
                 validation=v["validation"], model=v["model"], setup=v["setup"], batch_size=v["batch_size"],
                 root=v["cifar_root"], epochs=v["epochs"], eval_every=v["eval_every"], seeds=v["seeds"], methods=vit_methods,
                 step_sizes={methods.method_key(*methods.method(k)): x for k, x in v["step_sizes"].items()},
                 sweep_seeds=v["sweep_seeds"], sweep_epochs=v["sweep_epochs"], sweep_window=v["sweep_window"],
                 grow=v["sweep_grow"])
    assert swept.to_dict() == vision.VisionGrid.of(built).to_dict()
    assert at_paper.to_dict() == vision.VisionGrid.of(dict(built, methods=list(vision.PAPER_STEP_SIZES), step_sizes={
        k: [x] for k, x in vision.PAPER_STEP_SIZES.items()}, grow=0)).to_dict()  # one step each: nothing to grow
    with pytest.raises(ValueError, match="variation_setup='authors' is the replication's own setup"):
        sentiment.chapter_grids(**dict(p, variation_setup=p["setup"]))
    with pytest.raises(ValueError, match="analysed='both': choose one of replication, variation"):
        sentiment.chapter_grids(**dict(p, analysed="both"))


@pytest.mark.parametrize("notebook", ["05_token_selection", "06_weights"])
def test_a_reading_chapter_plans_over_the_grid_its_table1_parameter_names(notebook):
    """A smoke page that reads the default profile's Table 1 (table1="default") plans the forward passes
    through the default grid's models; with table1="" it reads its own profile's."""
    def analysed(profile: str):
        built = profiles.executed_parameters("04_sentiment", profile)
        return dict(zip(sentiment.GRIDS, sentiment.chapter_grids(**built)))[built["analysed"]].to_dict()

    smoke = profiles.executed_parameters(notebook, "smoke")
    assert smoke["table1"] == ""
    assert plan._read_grid(notebook, smoke).to_dict() == analysed("smoke")
    assert plan._read_grid(notebook, dict(smoke, table1="default")).to_dict() == analysed("default")
    assert analysed("smoke") != analysed("default")


def test_the_paper_plan_counts_the_papers_runs():
    stages = {(s.notebook, s.what): s for s in plan.plan("paper")}
    assert list(chapters.NAMES) == list(dict.fromkeys(n for n, _ in stages))
    table1 = stages["04_sentiment", "Table 1 grid (replication)"]
    assert table1.runs == 3 * 3 * 10  # layers x methods x seeds
    expected = sum(10 * paper.EPOCHS_TO_STOP[L][k] for L in (3, 4, 6) for k in methods.PAPER_PS)
    assert table1.steps == 225 * expected and table1.steps_cap == 225 * 1000 * 90
    finals = stages["07_vision", "final runs"]
    assert finals.runs == 2 * 5 * 3 and finals.steps == 30 * 2000 * 500  # datasets x methods x seeds
    assert stages["07_vision", "step-size sweep (validation images)"].runs == 2 * 3 * 4  # 1.75, 2, 3: 4 steps each
    assert ("07_vision", plan.AT_PAPER) not in stages  # the paper's steps are the finals' own here
    default = {(s.notebook, s.what): s for s in plan.plan("default")}
    assert default["07_vision", "final runs"].runs == 5 * 3 and default["07_vision", plan.AT_PAPER].runs == 2 * 3
    pruned = default["07_vision", "pruning curves of the final runs"]  # of the 15 finals' test images, not 21
    assert pruned.steps == 15 * workload.SPLITS["fashion_mnist"][2] * len(
        profiles.executed_parameters("07_vision", "default")["sparsities"])
    assert "imdb" in table1.data and {"cifar10", "cifar100"} <= set(finals.data)
    assert all(s.cpu_hours > 0 for s in stages.values() if s.steps)


def test_the_readme_and_the_reproduce_page_show_the_paper_plan():
    """By FLOPs (no shape of the paper's is timed unless `plan --measure` times it), on 2 cores."""
    shown = plan.markdown(plan.plan("paper", cores=2), "paper")
    for page in ("README.md", "book/reproduce.md"):
        assert shown in (ROOT / page).read_text("utf-8"), f"{page}: paste `python -m mdlib plan --profile paper --markdown`"


def test_a_shapes_timing_prices_its_runs():
    """A real timing of a tiny model: positive costs; a run is its epochs of batches, evaluations and
    checkpoints, and its fixed seconds."""
    config = sentiment.run_config(layers=2, width=16, max_length=12, optimizer="md", lr=1e-3, p=1.1)
    timing = steptimes.measure(sentiment.KIND, config, target=0.05)
    assert timing.batch > 0 and timing.evaluate >= 0 and timing.checkpoint > 0
    timer = plan.StepTimer(_FakeTimings({steptimes.shape(sentiment.KIND, config): timing}),
                           plan.FlopRate(plan.CPU_SECONDS_PER_TFLOP, "test"))
    work = workload.sentiment_work(config)
    assert timer.run_seconds(sentiment.KIND, config, work) == pytest.approx(plan.RUN_SECONDS + work.epochs * (
        work.steps_per_epoch * timing.batch + work.eval_examples_per_epoch / work.batch_size * timing.evaluate
        + timing.checkpoint))
    assert timer.basis(sentiment.KIND, config) == f"timed here {timing.when}" and timer.timed
    assert plan.measure_cpu() > 0


class _FakeTimings:
    """``steptimes.Timings`` answering from a dict (shape -> Timing)."""

    device = "cpu"

    def __init__(self, found, probe=None):
        self.found, self.reading = found, probe

    def get(self, kind, config, estimate=None):
        return self.found.get(steptimes.shape(kind, config))

    def prepare(self, items):
        pass

    def probe(self):
        return self.reading


def test_a_shape_is_timed_once_per_machine_and_cached(tmp_path, monkeypatch):
    timed = []

    def fake_measure_all(items, device="cpu", at_once=1):
        timed.append([config.optimizer.lr for _, config in items])
        return [steptimes.Timing(0.01, 0.004, 0.002, "2026-12-06") for _ in items]

    monkeypatch.setattr(steptimes, "measure_all", fake_measure_all)
    monkeypatch.setattr(steptimes, "probe", lambda: 0.05)
    machine = {"name": "host A, a CPU, 2 cores"}
    monkeypatch.setattr(steptimes, "machine", lambda device="cpu": machine["name"])
    path = tmp_path / "plan-timings.json"
    config = sentiment.run_config(layers=2, width=16, max_length=12, optimizer="md", lr=1e-3, p=1.1)
    same_shape = dataclasses.replace(config, optimizer=dataclasses.replace(config.optimizer, lr=3e-3),
                                     fit=dataclasses.replace(config.fit, seed=4))
    timings = steptimes.Timings("cpu", "short", path, at_once=2)
    timings.prepare([(sentiment.KIND, config, 1.0), (sentiment.KIND, same_shape, 1.0)])
    assert timed == [[1e-3]]  # one shape: the step size and the seed do not change a batch's cost
    assert timings.get(sentiment.KIND, same_shape) == steptimes.Timing(0.01, 0.004, 0.002, "2026-12-06")
    assert steptimes.Timings("cpu", "short", path, at_once=2).get(sentiment.KIND, config, 1.0) is not None
    assert len(timed) == 1  # read back from the cache by the next plan
    assert steptimes.Timings("cpu", "short", path, at_once=1).get(sentiment.KIND, config, 1.0) is not None
    assert len(timed) == 2  # timed alone is another timing
    machine["name"] = "host B, another CPU, 8 cores"
    assert steptimes.Timings("cpu", "cached", path, at_once=2).get(sentiment.KIND, config, 1.0) is None
    assert steptimes.Timings("cpu", "short", path, at_once=2).get(sentiment.KIND, config, 1e3) is None  # too long
    assert len(timed) == 2
    assert steptimes.Timings("cpu", "short", path, at_once=2).get(sentiment.KIND, config, 1.0) is not None
    assert len(timed) == 3  # each machine times its own
    assert set(json.loads(path.read_text())) == {"host A, a CPU, 2 cores", "host B, another CPU, 8 cores"}
    steptimes.Timings("cpu", "all", path, at_once=2).get(sentiment.KIND, config, 100.0)
    assert len(timed) == 4  # plan --measure times it again, a longer timing too
    assert steptimes.Timings("cpu", "all", path, at_once=2).get(sentiment.KIND, config, 1e4) is None
    assert len(timed) == 4  # but not one of hours: by FLOPs


def test_the_speed_probe_is_read_with_the_timings_and_cached_beside_them(tmp_path, monkeypatch):
    """The plan's reading of the speed probe is the one taken when its shapes were timed (the mean of its
    readings before and after them): cached with them, read again with them (``plan --measure``), read now
    only where none is cached."""
    readings = iter([0.04, 0.06, 0.05, 0.07, 0.09])
    monkeypatch.setattr(steptimes, "probe", lambda: next(readings))
    monkeypatch.setattr(steptimes, "measure_all", lambda items, device="cpu", at_once=1: [
        steptimes.Timing(0.01, 0.004, 0.002, "2026-12-07") for _ in items])
    path = tmp_path / "plan-timings.json"
    config = sentiment.run_config(layers=2, width=16, max_length=12, optimizer="md", lr=1e-3, p=1.1)
    other = dataclasses.replace(config, max_length=16)
    assert steptimes.Timings("cpu", "short", path).probe() is None  # nothing timed on this machine yet
    steptimes.Timings("cpu", "short", path).get(sentiment.KIND, config, 1.0)  # a shape timed: the probe with it
    assert steptimes.Timings("cpu", "cached", path).probe()[0] == pytest.approx(0.05)  # (0.04 + 0.06) / 2
    steptimes.Timings("cpu", "short", path).get(sentiment.KIND, config, 1.0)  # cached: nothing timed, nor read
    assert steptimes.Timings("cpu", "short", path).probe()[0] == pytest.approx(0.05)
    timings = steptimes.Timings("cpu", "all", path)  # plan --measure: every shape again, and the probe
    timings.prepare([(sentiment.KIND, config, 1.0), (sentiment.KIND, other, 1.0)])
    assert timings.probe()[0] == pytest.approx(0.06)  # (0.05 + 0.07) / 2
    assert steptimes.Timings("cpu", "cached", path).probe()[0] == pytest.approx(0.06)
    assert "speed probe" in json.loads(path.read_text())[steptimes.machine("cpu")]


def test_the_speed_probe_reads_a_training_step_and_can_be_turned_off(monkeypatch):
    seconds = steptimes.probe(steps=3)
    assert 1e-4 < seconds < 5
    monkeypatch.setenv(steptimes.PROBE_ENV, "off")
    assert not steptimes.probing()
    monkeypatch.setenv(steptimes.PROBE_ENV, "sometimes")
    with pytest.raises(ValueError, match="give on"):
        steptimes.probing()


def test_the_token_lengths_are_the_datas(monkeypatch):
    """``steptimes.TOKEN_LENGTHS`` holds Rotten Tomatoes' training texts' lengths (where the data is here)."""
    from collections import Counter

    from mdlib.experiments import fetch
    from mdlib.experiments.sentiment import tokens

    if not (fetch.data_dir() / "movieReviewSnippets_GroundTruth.txt").is_file():
        pytest.skip("Rotten Tomatoes is not in the data cache")
    counts = Counter(len(ids) for ids in tokens.splits("rotten_tomatoes", 0, 512)["train"].ids)
    assert dict(counts) == dict(steptimes.TOKEN_LENGTHS["rotten_tomatoes"])


def test_schedule_lays_runs_out_on_the_workers_round_by_round():
    assert plan.schedule({1: [3.0, 3.0, 2.0], 2: [5.0]}, 2) == 5.0 + 5.0
    assert plan.schedule({1: [4.0, 1.0, 1.0, 1.0]}, 2) == 4.0
    assert plan.schedule({1: [4.0, 1.0]}, 1) == 5.0
    assert plan.schedule({}, 2) == 0.0


class _PerEpoch(plan.FlopRate):
    """A rate of ``seconds`` an epoch, none for a forward pass."""

    def __init__(self, seconds: float):
        super().__init__(0.0, f"test: {seconds} s an epoch")
        self.seconds = seconds

    def run_seconds(self, kind, config, work):
        return work.epochs * self.seconds

    def forward_seconds(self, kind, config, examples):
        return 0.0

    def basis(self, kind, config):
        return "the test's rate"


def _store_run(root: Path, kind: str, config, epochs: int, reached: bool = True) -> None:
    """A results store entry as ``epochs.stored_runs`` reads it: the config and the history's epochs."""
    import pandas as pd

    folder = root / "runs" / kind / identity.config_key(kind, config)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config.to_dict()))
    accuracy = [0.9] * (epochs - 1) + [0.999 if reached else 0.9]
    pd.DataFrame({"epoch": range(1, epochs + 1), "train_accuracy": accuracy}).to_parquet(folder / "history.parquet")


def test_the_plans_epochs_and_wall_time_follow_the_stored_runs(tmp_path, monkeypatch):
    """A store holding the variation's sweep: each sweep run is expected at its own epochs, each final run
    (its step not chosen yet) at the mean over the candidates of their runs' mean, the replication (no run
    known) at its cap; the wall time lays these out, 2 at a time, round by round."""
    monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path))
    monkeypatch.setattr(known_epochs, "committed_runs", list)
    values = profiles.executed_parameters("04_sentiment", "default")
    planned = plan.planned_runs("04_sentiment", values)
    variation = [run for run in planned if run.stage.startswith("Table 1, variation")]
    sweep = [run for run in variation if len(run.alternatives) == 1]
    finals = [run for run in variation if len(run.alternatives) > 1]
    assert (len(sweep), len(finals)) == (2 * 3 * 2, 2 * 4)  # methods x candidates x seeds; 4 more seeds each
    stored = {}
    for i, run in enumerate(sweep):
        stored[run.key] = 40 + 5 * i  # within the cap of 100
        _store_run(tmp_path, run.kind, run.config, stored[run.key])

    def at(config) -> float:  # the stored runs' mean epochs at the config's method and step
        same = [stored[r.key] for r in sweep if r.config.optimizer == config.optimizer]
        return sum(same) / len(same)

    expected = {run.key: stored[run.key] for run in sweep}
    expected |= {run.key: sum(at(c) for c in run.alternatives) / len(run.alternatives) for run in finals}
    expected |= {run.key: run.config.fit.epochs for run in planned if run not in variation}  # the replication
    found = plan.plan("default", plan.Costs(_PerEpoch(10.0), _PerEpoch(10.0)), device="cpu", cores=2)
    rows = {s.what: s for s in found if s.notebook == "04_sentiment"}
    row = rows[f"Table 1, variation ({sentiment.chapter_grids(**values)[1].setup})"]
    assert row.runs == 20 and not row.bound
    assert row.epochs == pytest.approx(sum(expected[run.key] for run in variation) / 20)
    assert row.steps == pytest.approx(85 * sum(expected[run.key] for run in variation))  # 8,455 sentences, batch 100
    assert row.cpu_hours == pytest.approx(10 * sum(expected[run.key] for run in variation) / 3600)
    assert "12 stored" in row.note and "the same runs' epochs" in row.note and "mean of the known runs" in row.note
    replication = rows["Table 1 grid (replication)"]
    assert replication.bound and replication.epochs == 30 and "the epoch cap" in replication.note

    def greedy(seconds: list[float], workers: int = 2) -> float:
        free = [0.0] * workers
        for x in seconds:
            free[free.index(min(free))] += x
        return max(free)

    first = [10 * expected[run.key] for run in planned if run.round == 1]
    second = [10 * expected[run.key] for run in planned if run.round == 2]
    assert len(first) == 3 + 12 and len(second) == 8  # the replication and the sweep, then the finals
    wall = {w.notebook: w for w in found.walls}["04_sentiment"]
    assert wall.training == pytest.approx(greedy(first) + greedy(second))
    assert wall.total == pytest.approx(wall.training + chapters.chapter("04_sentiment").rest.seconds)
    assert sum(s.wall for s in rows.values()) == pytest.approx(wall.total)
    assert found.wall == pytest.approx(sum(found.wall_of(g) for g in found.groups) + plan.HTML.seconds)
    side = found.wall_of(["01_fixed_decoder_paths", "02_single_instance_path", "03_joint_training"])
    measured = {name: chapters.chapter(name).work.measured.seconds
                for name in ("01_fixed_decoder_paths", "02_single_instance_path", "03_joint_training")}
    assert side == pytest.approx(max(measured["01_fixed_decoder_paths"] + measured["03_joint_training"],
                                     measured["02_single_instance_path"]))  # two at once on 2 cores, the next to the first free
    assert all(s.note for s in found), "every row names its basis"


def test_expected_epochs_fall_back_to_the_nearest_step_then_the_cap():
    config = sentiment.run_config(layers=3, width=24, optimizer="md", p=1.1, lr=8e-4, seed=3, epochs=100,
                                  setup="small-embeddings")
    setting = known_epochs.setting(sentiment.KIND, config.to_dict())
    known = [known_epochs.Known(setting, 2.4e-3, 0, 60, True, "test.csv"),
             known_epochs.Known(setting, 2.4e-3, 1, 80, True, "test.csv"),
             known_epochs.Known(setting, 8e-5, 0, 150, False, "test.csv")]  # 10x smaller: farther
    nearest = known_epochs.expect(sentiment.KIND, config, known)
    assert (nearest.how, nearest.epochs, nearest.ratio) == ("nearest", 70.0, pytest.approx(3.0))
    at_step = known_epochs.expect(sentiment.KIND, config, known + [known_epochs.Known(setting, 8e-4, 0, 44, True, "t")])
    assert (at_step.how, at_step.epochs) == ("setting", 44.0)
    capped = known_epochs.expect(sentiment.KIND, dataclasses.replace(config, optimizer=dataclasses.replace(
        config.optimizer, lr=1e-5)), known)
    assert (capped.how, capped.epochs) == ("nearest", 100.0)  # 150 epochs seen, at most this run's cap of 100
    other = sentiment.run_config(layers=3, width=24, optimizer="md", p=2.0, lr=4e-4, epochs=100, setup="small-embeddings")
    assert known_epochs.expect(sentiment.KIND, other, known) == known_epochs.Expected(100.0, "cap", bound=True)
    assert "2 in test.csv" in known_epochs.describe([nearest]) and "at 3x their step" in known_epochs.describe([nearest])


def test_the_committed_pilots_are_the_defaults_runs():
    """A pilot row and the long build's row of the same run are read as the run config chapter 04 trains
    (its seed 0 at l_1.1's paper step: 56 epochs in the pilot, the long build's own count beside it)."""
    values = profiles.executed_parameters("04_sentiment", "default")
    variation = sentiment.chapter_grids(**values)[1]
    config = variation.run((variation.layers[0], "1.1"), 1.0, 0)
    found = known_epochs.expect(sentiment.KIND, config, known_epochs.committed_runs())
    long = pd.read_csv(paths.data_file(known_epochs.OVERNIGHT), dtype={"method": str})
    row = long[(long.part == "series") & np.isclose(long.embedding_std, 0.02) & (long.method == "1.1")
               & np.isclose(long.multiple, 1.0) & (long.seed == 0)]
    assert (found.how, found.epochs) == ("run", pytest.approx((56.0 + float(row.epochs.iloc[0])) / 2))
    assert found.sources == {known_epochs.PILOTS: 1, known_epochs.OVERNIGHT: 1}


@pytest.mark.parametrize("profile", ["default", "overnight", "paper"])
def test_the_planned_runs_are_the_grids_runs(profile):
    """``chapter_runs`` counts what ``workload.grid_runs`` counts, stage by stage, a run once."""
    values = profiles.executed_parameters("04_sentiment", profile)
    seen, expected = set(), {}
    for _, designs, _ in plan._sentiment_designs(values):
        for key, run in workload.grid_runs(designs).items():
            if key not in seen:
                seen.add(key)
                expected[key] = run
    assert list(plan.chapter_runs("04_sentiment", values)) == list(expected)
    v = profiles.executed_parameters("07_vision", profile)
    swept, at_paper = vision.chapter_grids(**v)
    fixed, chosen = workload.grid_runs([at_paper.design()]), workload.grid_runs([swept.design()])
    planned = plan.chapter_runs("07_vision", v)
    # the runs at the paper's steps are trained whatever the sweep chooses: a swept final whose step the
    # sweep chooses does not stand in at one of them (its first candidate can be the paper's step)
    assert set(fixed) <= set(planned) and not any(run.chosen and key in fixed for key, run in planned.items())
    if profile == "paper":  # Adam and l_1.1 train at the paper's steps, unswept: the same runs
        assert len(planned) == len(chosen)
    else:  # their steps are swept from the paper's up: the 6 runs at the paper's come on top of the 6 chosen
        assert len(fixed) == 6 and set(fixed) <= set(chosen) and len(planned) == len(chosen) + 6


@pytest.mark.parametrize("profile", ["smoke", "default"])
def test_each_row_names_the_runs_its_grids_may_add_by_growing(profile):
    """A grid whose choice sits at an end of its candidates grows (``Design.grow``); the plan counts the
    first candidates' runs and names, in each row whose grids may grow, the most that growth adds
    (``Design.grown_at_most``); a row whose grids cannot grow names nothing."""
    rows = {(s.notebook, s.what): s for s in plan.plan(profile, cores=2)}
    values = profiles.executed_parameters("04_sentiment", profile)
    swept, at_paper = vision.chapter_grids(**profiles.executed_parameters("07_vision", profile))
    bounds = {("04_sentiment", what): sum(d.grown_at_most() for d in designs)
              for what, designs, _ in plan._sentiment_designs(values)}
    bounds |= {("07_vision", plan.SWEEP): swept.design().grown_at_most(),
               ("07_vision", plan.AT_PAPER): at_paper.design().grown_at_most()}
    assert any(bounds.values())
    for row, most in bounds.items():
        if row in rows:
            said = re.findall(r"up to (\d+) more runs where a choice sits at an end", rows[row].note)
            assert said == ([str(most)] if most else []), row


def _no_apt_path(tmp_path: Path) -> str:
    """A PATH with the interpreter's folder and git but no apt-get (a RHEL node, macOS)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in ("git",):
        found = subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip()
        if found:
            (folder / tool).symlink_to(found)
    return str(folder)


def test_plan_of_the_paper_profile_runs_without_apt_or_data(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    env = dict(os.environ, PATH=_no_apt_path(tmp_path), MDLIB_DATA_DIR=str(data), MDLIB_BUILD_DIR=str(tmp_path / "b"),
               MDLIB_ROOT=str(ROOT), XDG_CACHE_HOME=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-m", "mdlib", "plan", "--profile", "paper"], capture_output=True,
                          text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for name in chapters.NAMES:
        assert re.search(rf"^{name}\s", done.stdout, re.M), name
    assert re.search(r"^04_sentiment\s+Table 1 grid \(replication\)\s+90\s+\d+ \(<= 1,000\)\s+2\.1 M", done.stdout, re.M)
    assert re.search(r"^total\s+178\s+<= [\d,.]+\s+<= [\d,.]+\s+<= [\d,.]+ h$", done.stdout, re.M)
    assert list(data.iterdir()) == [] and not (tmp_path / "b").exists()  # nothing fetched, nothing written
    assert not (tmp_path / "cache").exists()  # nothing timed: the paper's shapes are long to time on a CPU


def test_plan_refuses_an_unknown_profile(capsys):
    from mdlib.book import cli

    assert cli.main(["plan", "--profile", "nope"]) == 1
    assert "nope" in capsys.readouterr().err


def test_plan_names_a_profile_value_of_the_wrong_type_in_one_line(tmp_path, monkeypatch, capsys):
    import shutil

    from mdlib.book import cli

    params = tmp_path / "params"
    shutil.copytree(paths.params_dir(), params)
    smoke = (params / "smoke.yaml").read_text()
    (params / "smoke.yaml").write_text(smoke.replace("04_sentiment:\n", "04_sentiment:\n  seeds: four\n", 1)
                                       .replace('  seeds: {"1.1": 2, "2": 2, "3": 1}\n', ""))
    monkeypatch.setattr(paths, "params_dir", lambda: params)
    assert cli.main(["plan", "--profile", "smoke"]) == 1
    err = capsys.readouterr().err
    assert err == ("error: 04_sentiment: parameter 'seeds' from params/smoke.yaml should be a mapping like its "
                   'default {"1.1": 1, "2": 1, "3": 1}, got \'four\'\n'), err


def test_a_chapters_other_cells_shrink_with_its_work_never_below_a_kernels_start():
    """At the default profile a chapter's other cells take their measured time; where it does less (smoke),
    less in proportion, at least ``REST_FLOOR`` (or the default's, where less); where it does more (paper),
    the default's."""
    def rest(profile: str) -> dict[str, float]:
        return {s.notebook: s.wall for s in plan.plan(profile, cores=2) if s.what.startswith("the other cells")}

    default, smoke, paper_scale = rest("default"), rest("smoke"), rest("paper")
    assert default == {c.name: c.rest.seconds for c in chapters.CHAPTERS if c.rest}
    assert all(min(plan.REST_FLOOR, default[name]) <= smoke[name] <= default[name] for name in default)
    assert any(smoke[name] < default[name] for name in default)
    assert paper_scale == default


def test_a_measured_time_is_scaled_to_the_machines_speed_as_of_the_plans_timings(monkeypatch):
    """A CPU chapter's or other cells' reference time whose build read the speed probe is scaled by the
    probe's reading as of the plan's timings over that one; without either reading it stays as measured."""
    base = plan.default_costs()
    original = chapters.chapter

    def probed(name):  # 01 measured at a probe of 50 ms, 02 without a reading, the other cells at 50 ms
        found = original(name)
        if name in ("01_fixed_decoder_paths", "02_single_instance_path"):
            return dataclasses.replace(found, work=dataclasses.replace(found.work, measured=dataclasses.replace(
                found.work.measured, probe=0.05 if name.startswith("01") else None)))
        return dataclasses.replace(found, rest=dataclasses.replace(found.rest, probe=0.05)) if found.rest else found

    monkeypatch.setattr(chapters, "chapter", probed)

    def walls(reading):
        costs = plan.Costs(base.gpu, plan.StepTimer(_FakeTimings({}, reading), base.cpu))
        found = plan.plan("default", costs, cores=2, known=known_epochs.committed_runs())
        return {w.notebook: w for w in found.walls}, found

    same, slower, unread = walls((0.05, "then"))[0], walls((0.075, "then"))[0], walls(None)[0]
    first, rested = "01_fixed_decoder_paths", "05_token_selection"
    assert same[first].total == pytest.approx(original(first).work.measured.seconds)
    assert slower[first].total == pytest.approx(1.5 * same[first].total) and unread[first].total == same[first].total
    assert slower[rested].rest == pytest.approx(1.5 * same[rested].rest) and unread[rested].rest == same[rested].rest
    assert slower["02_single_instance_path"].total == same["02_single_instance_path"].total  # measured unprobed
    notes = " ".join(stage.note for stage in walls((0.075, "then"))[1] if stage.notebook == first)
    assert "1.50x: the speed probe read 75 ms then, 50 ms in that build" in notes


def _executed(folder: Path, walls: dict[str, float], profile: str = "default",
              speeds: dict[str, tuple[float, float]] | None = None) -> Path:
    """Executed notebooks as papermill leaves them: the whole notebook's duration and its parameters, and
    where given the speed probe's readings (before, after) of the execution."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, seconds in walls.items():
        meta = {"papermill": {"duration": seconds, "parameters": {"profile": profile}}}
        if name in (speeds or {}):
            meta["mdlib"] = {"speed": {"before": speeds[name][0], "after": speeds[name][1], "probe": "a probe"}}
        (folder / f"{name}.ipynb").write_text(json.dumps({"cells": [], "metadata": meta, "nbformat": 4,
                                                          "nbformat_minor": 5}), "utf-8")
    return folder


def test_the_plan_against_a_build_reads_each_chapters_duration_and_judges_the_ratio(tmp_path):
    found = plan.plan("default", cores=2, known=known_epochs.committed_runs())
    planned = {w.notebook: w.total for w in found.walls}
    factors = {name: 1.0 for name in chapters.NAMES} | {"04_sentiment": 1.3, "05_token_selection": 0.8,
                                                         "03_joint_training": 2.0}
    folder = _executed(tmp_path / "notebooks", {n: planned[n] * factors[n] for n in chapters.NAMES})
    (folder / "notes.ipynb").write_text("{}", "utf-8")  # not a chapter: not read
    build = plan.executed(folder)
    assert build.profile == "default" and set(build.walls) == set(chapters.NAMES) and not build.speeds
    table = plan.against(found, build)
    rows = {line.split()[0]: line.split() for line in table.splitlines()[2:-1]}  # the table, not the note below
    assert rows["04_sentiment"][-2:] == ["1.30", "no"] and rows["05_token_selection"][-2:] == ["0.80", "yes"]
    assert rows["03_joint_training"][-2:] == ["2.00", "no"] and rows["01_fixed_decoder_paths"][-2:] == ["1.00", "yes"]
    side = ["01_fixed_decoder_paths", "02_single_instance_path", "03_joint_training"]
    side_measured = plan.schedule({0: [planned[n] * factors[n] for n in side]}, 2)
    total = side_measured + sum(planned[n] * factors[n] for n in chapters.NAMES if n not in side)
    assert rows["the"][4] == f"{total:,.0f}"  # 01-03 side by side on the 2 cores, as the book runs them
    assert "not told apart" in table  # no probe readings


def test_the_plan_against_a_build_tells_the_machines_drift_from_the_plans_error(tmp_path):
    """With the speed probe's readings, a chapter that ran slow because the machine did (its probe read
    1.3x the plan's) is within the plan at the plan's speed; one slower than its probe is not."""
    found = plan.plan("default", cores=2, known=known_epochs.committed_runs())
    planned = {w.notebook: w.total for w in found.walls}
    factors = {name: 1.0 for name in chapters.NAMES} | {"04_sentiment": 1.3, "05_token_selection": 1.6}
    speeds = {name: (0.04, 0.04) for name in chapters.NAMES} | {"04_sentiment": (0.05, 0.054),
                                                                 "05_token_selection": (0.05, 0.054)}
    build = plan.executed(_executed(tmp_path, {n: planned[n] * factors[n] for n in chapters.NAMES}, speeds=speeds))
    assert build.speeds["04_sentiment"] == pytest.approx(0.052)
    rows = {line.split()[0]: line.split() for line in plan.against(found, build, (0.04, "then")).splitlines()[2:-1]}
    assert rows["04_sentiment"][-5:] == ["1.30", "no", "1.30", "1.00", "yes"]
    assert rows["05_token_selection"][-5:] == ["1.60", "no", "1.30", "1.23", "yes"]
    assert rows["06_weights"][-5:] == ["1.00", "yes", "1.00", "1.00", "yes"]
    assert rows["the"][-1] == "yes"


def test_the_plan_against_a_build_names_what_it_lacks_and_refuses_mixed_profiles(tmp_path, monkeypatch, capsys):
    from mdlib.book import cli

    found = plan.plan("default", cores=2, known=known_epochs.committed_runs())
    folder = _executed(tmp_path / "some", {"05_token_selection": 16.0, "06_weights": 31.0})
    table = plan.against(found, plan.executed(folder))
    assert "not executed" in table and "the chapters executed" in table  # 05 and 06 alone
    monkeypatch.setattr(plan, "machine_costs", lambda measure=False: plan.default_costs())  # no timing here
    assert cli.main(["plan", "--profile", "smoke", "--against", str(folder)]) == 1
    assert "ran at profile 'default', not 'smoke'" in capsys.readouterr().err
    assert cli.main(["plan", "--profile", "default", "--against", str(folder)]) == 0
    assert "06_weights" in capsys.readouterr().out
    _executed(folder, {"07_vision": 700.0}, profile="smoke")
    assert cli.main(["plan", "--profile", "default", "--against", str(folder)]) == 1
    assert "different profiles" in capsys.readouterr().err
    assert cli.main(["plan", "--profile", "default", "--against", str(tmp_path / "none")]) == 1
    assert "no executed notebook" in capsys.readouterr().err
