"""The command line's errors: one or two lines naming the problem, before any work starts; Ctrl-C
ends with one line and exit code 130."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import HTML
from mdlib.book import cli, execute, profiles
from mdlib.experiments import paths

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def fixture_repo(monkeypatch):
    """The CLI sees the fixture notebook and profiles; returns the list of notebook executions started."""
    monkeypatch.setattr(paths, "notebooks_dir", lambda: FIXTURES / "notebooks")
    monkeypatch.setattr(paths, "params_dir", lambda: FIXTURES / "params")
    started = []
    monkeypatch.setattr("papermill.execute_notebook", lambda *args, **kwargs: started.append(args))
    return started


def _error(capsys, started: list, argv: list[str]) -> str:
    assert cli.main(argv) == 1
    assert not started, "the command started work despite an error in its input"
    err = capsys.readouterr().err
    assert 1 <= len(err.strip().splitlines()) <= 2, err
    return err


def test_malformed_yaml_value_is_one_line(fixture_repo, capsys):
    err = _error(capsys, fixture_repo, ["run", "01_fixture", "-p", "ps", "[1.5, 2"])
    assert err.startswith("error: -p ps '[1.5, 2', line 1, column 8: not valid YAML: expected ',' or ']'")
    assert "values are YAML" in err
    err = _error(capsys, fixture_repo, ["run", "01_fixture", "-p", "schedule", "{kind: a, kind: b}"])
    assert "-p schedule" in err and "duplicate key 'kind'" in err


def test_repeated_parameter_is_refused(fixture_repo, capsys):
    argv = ["run", "01_fixture", "-p", "seeds", "3", "-p", "lr", "0.1", "-p", "seeds", "4"]
    err = _error(capsys, fixture_repo, argv)
    assert err == "error: -p seeds given more than once; give each parameter once\n"


@pytest.mark.parametrize("name,text,expected", [
    ("name", "1e-3", "1e-3"), ("name", "yes", "yes"), ("name", "null", "null"), ("name", "", ""),
    ("name", "a #b", "a #b"), ("name", "[a]", "[a]"), ("name", "'1e-3'", "1e-3"), ("name", '"tab\\t"', "tab\t"),
    ("lr", "1e-3", 1e-3), ("ps", "[1e-3, 2]", [1e-3, 2]), ("schedule", "yes", True),
])
def test_a_string_parameter_takes_the_text_as_typed(fixture_repo, monkeypatch, text, name, expected):
    """Only where the default is a string (YAML quotes still read as YAML); other values are YAML."""
    given = []
    monkeypatch.setattr(execute, "run_notebook", lambda notebook, profile, overrides, **folders: given.append(overrides))
    assert cli.main(["run", "01_fixture", "-p", name, text]) == 0
    assert repr(profiles.resolve_parameters("01_fixture", "default", given[0])[name]) == repr(expected)


@pytest.mark.parametrize("name,value", [("lr", "nan"), ("lr", "inf"), ("lr", "1e400"), ("seeds", "nan"),
                                        ("ps", "[1.5, .nan]"), ("schedule", "{kind: cosine, scale: .inf}")])
def test_non_finite_values_are_refused(fixture_repo, capsys, name, value):
    err = _error(capsys, fixture_repo, ["run", "01_fixture", "-p", name, value])
    assert f"parameter {name!r} from the overrides" in err and "nan and infinity are not accepted" in err


@pytest.mark.parametrize("text,expected", [
    ("01_fixture:\n  seeds: 2\n  lr: [0.1\n", r"smoke.yaml, line 4, column 1: not valid YAML: expected ',' or ']'"),
    ("01_fixture:\n  seeds: 2\n  lr: 0.1\n  seeds: 3\n", r"smoke.yaml, line 4, column 3: duplicate key 'seeds' "
                                                          r"\(first on line 2\)"),
    ("01_fixture:\n  seeds: 2\n01_fixture:\n  lr: 0.1\n", r"line 3, column 1: duplicate key '01_fixture'"),
    ("01_fixture:\n  lr: .nan\n", r"'lr' from params/smoke.yaml is nan: nan and infinity are not accepted"),
    ("01_fixture:\n  lr: inf\n", r"'lr' from params/smoke.yaml is inf"),  # YAML's string, made a number
    ("01_fixtur:\n  seeds: 2\n", r"params/smoke.yaml has a section '01_fixtur', which is not a notebook \(did you "
                                  r"mean '01_fixture'\?\)"),
])
def test_broken_profile_file_is_named_with_its_line(fixture_repo, tmp_path, monkeypatch, capsys, text, expected):
    params = tmp_path / "params"
    params.mkdir()
    (params / "smoke.yaml").write_text(text)
    monkeypatch.setattr(paths, "params_dir", lambda: params)
    err = _error(capsys, fixture_repo, ["run", "01_fixture", "--profile", "smoke"])
    assert re.search(expected, err), err


@pytest.mark.parametrize("command", ["run", "book"])
@pytest.mark.parametrize("profile", ["../params/smoke", "OUTSIDE", ".hidden", HTML, "smoke\n"])
def test_a_profile_is_a_name_in_params_never_a_path(fixture_repo, tmp_path, monkeypatch, capsys, command, profile):
    """Every --profile below names a YAML file that exists; only the files params/<name>.yaml are profiles."""
    params = tmp_path / "params"
    shutil.copytree(FIXTURES / "params", params)
    for name in (".hidden", HTML):
        (params / f"{name}.yaml").write_text("01_fixture: {}\n")
    (tmp_path / "outside.yaml").write_text("01_fixture: {}\n")
    monkeypatch.setattr(paths, "params_dir", lambda: params)
    profile = profile.replace("OUTSIDE", str(tmp_path / "outside"))
    argv = ["run", "01_fixture"] if command == "run" else ["book"]
    err = _error(capsys, fixture_repo, [*argv, "--profile", profile])
    assert err.startswith(f"error: unknown profile {profile!r}; the profiles are smoke, default, paper (the files"), err


@pytest.mark.parametrize("argv,problem", [
    (["bench", "synthetic", "--seeds", "0"], "argument --seeds: must be an integer >= 1, got '0'"),
    (["bench", "optimizer", "--repeats", "-1"], "argument --repeats: must be an integer >= 1, got '-1'"),
    (["bench", "svm", "--repeats", "many"], "argument --repeats: must be an integer >= 1, got 'many'"),
    (["bench", "svn"], "invalid choice: 'svn' (choose from 'optimizer', 'svm', 'synthetic', 'training', 'store')"),
    (["fetch", "mnist"], "invalid choice: 'mnist' (choose from 'rotten_tomatoes', 'wordpiece_vocab'"),
])
def test_bad_arguments_get_argparse_two_lines(capsys, argv, problem):
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("usage: python -m mdlib") and problem in err[1], err


@pytest.mark.parametrize("argv,target", [
    (["run", "01_fixture"], "mdlib.book.execute.run_notebook"),
    (["book", "--skip-execute"], "mdlib.book.book.build"),
    (["fetch", "rotten_tomatoes"], "mdlib.experiments.fetch.fetch"),
    (["bench", "svm"], "svm"),  # an entry of bench.BENCHMARKS, the command line's table
])
def test_ctrl_c_ends_with_one_line(fixture_repo, monkeypatch, capsys, argv, target):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    if "." in target:
        monkeypatch.setattr(target, interrupted)
    else:
        from mdlib.book import bench

        monkeypatch.setitem(bench.BENCHMARKS, target, interrupted)
    assert cli.main(argv) == 130
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("interrupted: "), err


@pytest.mark.slow
def test_ctrl_c_during_execution_keeps_the_notebook_and_prints_one_line(tmp_path):
    """A real SIGINT while the kernel runs a cell: one line, exit 130, the previous notebook intact."""
    nbs, params = tmp_path / "notebooks", tmp_path / "params"
    nbs.mkdir()
    params.mkdir()
    (tmp_path / "_config.yml").write_text("title: sleep\n")
    (params / "default.yaml").write_text("{}\n")
    (nbs / "01_sleep.py").write_text('# %% tags=["parameters"]\nprofile = "default"  # profile\n\n'
                                     "# %%\nimport time\ntime.sleep(120)\n")
    previous = nbs / "01_sleep.ipynb"
    previous.write_text('{"previous": "good"}\n')
    script = textwrap.dedent(f"""
        import signal, sys
        from mdlib.book import cli
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job may ignore SIGINT
        sys.exit(cli.main(["--root", {str(tmp_path)!r}, "run", "01_sleep"]))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(paths.PACKAGE_DIR.parent)})
    deadline = time.monotonic() + 120
    staged = tmp_path / "_build" / ".staging" / "01_sleep" / "01_sleep.ipynb"
    while not staged.exists() and time.monotonic() < deadline:
        time.sleep(0.2)  # papermill writes the staged notebook when the kernel has started
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert lines[0].startswith("executing 01_sleep") and len(lines) == 2, err
    assert lines[1].startswith("interrupted: the previous executed notebook")
    assert previous.read_text() == '{"previous": "good"}\n'


def test_a_parameter_of_another_chapter_is_refused_and_named(monkeypatch, capsys):
    """05 reads the Table 1 grid 04 built (one parameter); 04's settings are not 05's parameters."""
    started = []
    monkeypatch.setattr("papermill.execute_notebook", lambda *args, **kwargs: started.append(args))
    err = _error(capsys, started, ["run", "05_token_selection", "-p", "epochs", "10"])
    assert err.startswith("error: 05_token_selection: unknown parameter 'epochs' in the overrides ('epochs' is a "
                          "parameter of 04_sentiment")
    assert "table1" in err


FAKE_NVIDIA_SMI = """#!/bin/sh
if [ "$1" = "-L" ]; then echo "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-0)"; echo "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-1)"
else echo "| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: 12.2     |"; fi
"""


@pytest.fixture
def no_cuda(monkeypatch, tmp_path, capsys):
    """torch sees no CUDA GPU, ``PATH`` holds only ``tmp_path/bin``, and papermill, instead of executing,
    records what was written to stderr before it started and stops the command (Ctrl-C); returns that
    record, a list of each start's stderr lines."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("mdlib.experiments.fetch.ensure", lambda names: None)  # no data fetched for these checks
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    starts = []

    def execute_notebook(*args, **kwargs):
        starts.append(capsys.readouterr().err.splitlines())
        raise KeyboardInterrupt

    monkeypatch.setattr("papermill.execute_notebook", execute_notebook)
    return starts


def _stderr_before_execution(starts: list, capsys, argv: list[str]) -> list[str]:
    """The lines ``cli.main(argv)`` wrote to stderr before papermill started (``no_cuda``)."""
    capsys.readouterr()
    assert cli.main(argv) == 130
    return starts[-1]


def test_the_paper_profile_warns_before_training_at_scale_without_a_gpu(no_cuda, capsys):
    lines = _stderr_before_execution(no_cuda, capsys, ["run", "07_vision", "--profile", "paper"])
    assert len(lines) == 2 and lines[1].startswith("executing 07_vision")
    assert lines[0].startswith("warning: 07_vision at the paper profile trains vision-transformer runs of up to "
                               "2,000 epochs") and "torch sees no CUDA GPU: on this CPU that takes months" in lines[0]
    assert "TORCH=" in lines[0] and "--extra-index-url https://download.pytorch.org/whl/cu" in lines[0]
    # other profiles, and chapters that do not train at the paper's scale, run without a warning
    for argv in (["run", "07_vision", "--profile", "smoke"], ["run", "01_fixed_decoder_paths", "--profile", "paper"]):
        assert [line.split()[0] for line in _stderr_before_execution(no_cuda, capsys, argv)] == ["executing"]


def test_the_warning_names_a_gpu_that_this_torch_cannot_use(no_cuda, capsys, tmp_path):
    import torch

    smi = tmp_path / "bin" / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI)
    smi.chmod(0o755)
    warning = _stderr_before_execution(no_cuda, capsys, ["run", "04_sentiment", "--profile", "paper"])[0]
    assert warning.startswith("warning: 04_sentiment at the paper profile trains about a hundred encoder runs")
    built = f"a CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU-only build"
    assert f"but torch {torch.__version__} ({built}) cannot use the 2 GPU(s) nvidia-smi lists (driver CUDA 12.2)" in warning
    assert "TORCH=" in warning and "a CUDA version at most the driver's" in warning
