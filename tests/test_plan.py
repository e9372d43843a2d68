"""What a profile costs (``mdlib.book.plan``, ``mdlib.experiments.workload``): the runs it counts are
the runs the grids train, its FLOPs are torch's count, its GPU rate is the paper's, and the command
runs with nothing but the checkout (no data, no apt)."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mdlib.book import chapters, plan, profiles
from mdlib.experiments import methods, paper, sentiment, store, vision, workload
from mdlib.models import EncoderClassifier, VisionTransformer
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
    monkeypatch.setattr(sentiment, "train_runs", fake)
    monkeypatch.setattr(sentiment, "test_correct", fake_correct)
    config = sentiment.SentimentGrid.of(sentiment_config())
    counted = workload.grid_runs([config.design()])
    sentiment.grid(config)
    trained = {store.config_key(sentiment.KIND, c) for c in fake.trained}
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
    assert "imdb" in table1.data and {"cifar10", "cifar100"} <= set(finals.data)
    assert all(s.cpu_hours > 0 for s in stages.values() if s.steps)


def test_the_readme_and_the_reproduce_page_show_the_paper_plan():
    shown = plan.markdown(plan.plan("paper"), "paper")
    for page in ("README.md", "book/reproduce.md"):
        assert shown in (ROOT / page).read_text("utf-8"), f"{page}: paste `python -m mdlib plan --profile paper --markdown`"


def test_measured_costs_time_each_model_shape_once():
    timer = plan.StepTimer("cpu", "test")
    config = sentiment.run_config(layers=2, width=16, max_length=12, optimizer="md", lr=1e-3, p=1.1)
    overhead, per_example = timer.step_cost(sentiment.KIND, config)
    assert overhead >= 0 and per_example >= 0 and overhead + per_example > 0
    assert timer.step_cost(sentiment.KIND, dataclasses.replace(config, fit=dataclasses.replace(config.fit, seed=3))
                           ) == (overhead, per_example)
    assert len(timer._cache) == 1
    work = workload.sentiment_work(config)
    step = overhead + work.batch_size * per_example
    evaluation = work.eval_examples_per_epoch / work.batch_size * (overhead + work.batch_size * per_example / 3)
    assert timer.run_seconds(sentiment.KIND, config, work) == pytest.approx(
        work.epochs * (work.steps_per_epoch * step + evaluation))
    assert plan.measure_cpu() > 0


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
               MDLIB_ROOT=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "mdlib", "plan", "--profile", "paper"], capture_output=True,
                          text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for name in chapters.NAMES:
        assert re.search(rf"^{name}\s", done.stdout, re.M), name
    assert re.search(r"^04_sentiment\s+Table 1 grid \(replication\)\s+90\s+\d+ \(<= 1,000\)\s+2\.1 M", done.stdout, re.M)
    assert re.search(r"^total\s+178\s+<= [\d,.]+\s+<= [\d,.]+$", done.stdout, re.M)
    assert list(data.iterdir()) == [] and not (tmp_path / "b").exists()  # nothing fetched, nothing written


def test_plan_refuses_an_unknown_profile(capsys):
    from mdlib.book import cli

    assert cli.main(["plan", "--profile", "nope"]) == 1
    assert "nope" in capsys.readouterr().err


def test_plan_names_a_profile_value_of_the_wrong_type_in_one_line(tmp_path, monkeypatch, capsys):
    import shutil

    from mdlib.book import cli, layout

    params = tmp_path / "params"
    shutil.copytree(layout.params_dir(), params)
    smoke = (params / "smoke.yaml").read_text()
    (params / "smoke.yaml").write_text(smoke.replace("04_sentiment:\n", "04_sentiment:\n  seeds: four\n", 1)
                                       .replace('  seeds: {"1.1": 2, "2": 2, "3": 1}\n', ""))
    monkeypatch.setattr(layout, "params_dir", lambda: params)
    assert cli.main(["plan", "--profile", "smoke"]) == 1
    err = capsys.readouterr().err
    assert err == ("error: 04_sentiment: parameter 'seeds' from params/smoke.yaml should be a mapping like its "
                   'default {"1.1": 1, "2": 1, "3": 1}, got \'four\'\n'), err
