"""The wheel of this checkout, installed into a fresh virtual environment (no system site-packages)
that has torch alone: it adds a few packages, trains and solves there, imports no extra, finds no
project and writes nothing into site-packages.

One environment for the module; the tests share it, on one xdist worker. Its torch is this
environment's, linked in: torch and the distributions it requires (their files, by their records),
nothing else, so the environment costs seconds and no disk (installing torch afresh downloads and
unpacks about 6 GB, which filled a CI machine's disk).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import venv
import zipfile
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import pytest
from packaging.requirements import Requirement

from mdlib.experiments import paths

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("wheel")]

CHECKOUT = paths.PACKAGE_DIR.parent
DISTRIBUTION = "attention-mirror-descent"
#: Never copied into the build: environments, build outputs, caches, git.
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", "_build", "build", "dist", "cache", "__pycache__",
                                     "*.egg-info", ".pytest_cache", ".ipynb_checkpoints", "*.ipynb", ".gl", ".whl")
#: Modules of the extras that the library must run without (none is installed in the environment).
EXTRAS = ("pandas", "jupyter", "jupyter_core", "jupyter_book", "papermill", "datasets", "matplotlib", "yaml",
          "tqdm", "sklearn", "numba")
#: Variables that would point the installed mdlib at this checkout or away from its defaults.
MOVED = ("PYTHONPATH", paths.ROOT_ENV, paths.BUILD_ENV, "MDLIB_DATA_DIR", paths.CACHE_ENV)


def _run(command: list, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    return done


def _requirement_closure(name: str) -> list[str]:
    """``name`` and every distribution it requires here, through the extras it asks of them (torch's
    ``cuda-toolkit[cublas, ...]``), by their markers on this platform."""
    extras_of: dict[str, frozenset] = {}
    todo = [(name, frozenset())]
    while todo:
        current, extras = todo.pop()
        key = current.lower().replace("_", "-")
        if key in extras_of and extras <= extras_of[key]:
            continue
        extras_of[key] = extras_of.get(key, frozenset()) | extras
        for line in metadata.distribution(current).requires or []:
            required = Requirement(line)
            if required.marker is None or any(required.marker.evaluate({"extra": e}) for e in ("", *extras_of[key])):
                todo.append((required.name, frozenset(required.extras)))
    return sorted(extras_of)


def _link_distributions(names: list[str], site: Path) -> None:
    """Link each top-level entry that the distributions ``names`` installed here (their RECORDs) into
    ``site``: the same files, importable and listed by pip there."""
    entries = set()
    for name in names:
        distribution = metadata.distribution(name)
        base = Path(distribution.locate_file(""))
        entries |= {(base, f.parts[0]) for f in distribution.files or [] if f.parts[0] != ".."}
    for base, entry in sorted(entries):
        target = site / entry
        if not target.exists():
            target.symlink_to(base / entry, target_is_directory=(base / entry).is_dir())


def _packages(python: Path) -> dict[str, str]:
    out = _run([python, "-m", "pip", "list", "--format=json"]).stdout
    return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(out)}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    work = tmp_path_factory.mktemp("wheel")
    timings = {}
    t0 = time.perf_counter()
    src = work / "src"  # a copy of the checkout: the build's own build/ and egg-info land there
    shutil.copytree(CHECKOUT, src, ignore=NOT_SOURCES, symlinks=True)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", work / "dist", src])
    (wheel,) = (work / "dist").glob("*.whl")
    timings["wheel"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    venv.create(work / "venv", with_pip=True)  # system_site_packages=False: nothing leaks in
    python = work / "venv" / ("Scripts" if os.name == "nt" else "bin") / ("python.exe" if os.name == "nt" else "python")
    timings["venv"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    _link_distributions(_requirement_closure("torch"), site)
    timings["torch"] = time.perf_counter() - t0
    with_torch = _packages(python)
    t0 = time.perf_counter()
    _run([python, "-m", "pip", "install", "-q", wheel])
    timings["wheel install"] = time.perf_counter() - t0
    installed = _packages(python)

    home = work / "home"  # the installed mdlib's user folders: never the real ones
    home.mkdir()
    run_env = {k: v for k, v in os.environ.items() if k not in MOVED} | {"HOME": str(home)}
    outside = work / "outside"  # no project here, and not the checkout (whose mdlib python -c would import)
    outside.mkdir()

    def run(code: str, *, cwd: Path = outside, **extra_env) -> dict:
        done = _run([python, "-c", textwrap.dedent(code)], cwd=cwd, env=run_env | extra_env, timeout=600)
        return json.loads(done.stdout.strip().splitlines()[-1])

    print("\nwheel test setup (s): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()), file=sys.stderr)
    yield SimpleNamespace(python=python, wheel=wheel, with_torch=with_torch, installed=installed, run=run,
                          home=home, outside=outside, env=run_env, timings=timings)
    shutil.rmtree(work / "venv", ignore_errors=True)  # the links go, torch stays


def test_the_wheel_holds_the_package_its_data_and_license(env):
    with zipfile.ZipFile(env.wheel) as wheel:
        names = set(wheel.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = wheel.read(info).decode()
    assert env.wheel.name.startswith("attention_mirror_descent-")
    assert {"mdlib/__init__.py", "mdlib/optim/__init__.py", "mdlib/optim/mirror_descent.py", "mdlib/svm.py", "mdlib/py.typed",
            "mdlib/_data/authors_sentences.csv", "mdlib/_data/pivotal_sentences.csv"} <= names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not [n for n in names if n.startswith(("tests/", "notebooks/", "params/", "book/", "data/"))]
    assert f"Name: {DISTRIBUTION}" in meta and "License-Expression: MIT" in meta
    required = sorted(line.split(": ", 1)[1] for line in meta.splitlines()
                      if line.startswith("Requires-Dist:") and "extra ==" not in line)
    assert [r.split(">")[0].split("=")[0] for r in required] == ["numpy", "scipy", "torch"], required


def test_the_wheel_adds_few_packages_beside_torch(env):
    added = {name: v for name, v in env.installed.items() if env.with_torch.get(name) != v}
    print(f"\nadded beside torch: {len(added)}: {sorted(added)}", file=sys.stderr)
    assert DISTRIBUTION in added and "torch" not in added
    assert len(added) <= 8, sorted(added)


def test_training_under_a_schedule_that_reaches_zero(env):
    """LpMirrorDescent under LambdaLR and CosineAnnealingLR schedules whose last steps take lr = 0."""
    result = env.run("""
        import json, sys
        import torch
        import mdlib
        from mdlib import LpMirrorDescent
        from mdlib.models import SingleHeadAttention
        torch.manual_seed(0)
        X, y, z = torch.randn(1, 8, 4, 3), torch.sign(torch.randn(1, 8)), torch.randn(1, 8, 3)
        out = {"mdlib": mdlib.__file__}
        for name in ("lambda", "cosine"):
            model = SingleHeadAttention(0.1 * torch.randn(1, 3, 3), torch.randn(1, 3))
            opt = LpMirrorDescent(model.parameters(), lr=0.5, p=1.5)
            steps = 10
            schedule = (torch.optim.lr_scheduler.LambdaLR(opt, lambda t: max(0.0, 1 - t / (steps - 2)))
                        if name == "lambda" else torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps - 1, 0.0))
            losses, lrs = [], []
            for _ in range(steps):
                opt.zero_grad()
                loss = model.loss(X, y, z)
                loss.backward()
                before = model.W.detach().clone()
                lrs.append(opt.param_groups[0]["lr"])
                opt.step()
                schedule.step()
                losses.append(loss.item())
            out[name] = {"losses": losses, "lrs": lrs, "still": bool(torch.allclose(model.W, before, atol=0, rtol=1e-12))}
        out["modules"] = sorted({m.split(".")[0] for m, v in sys.modules.items() if v is not None})
        print(json.dumps(out))
    """)
    assert Path(result["mdlib"]).parents[1] != CHECKOUT  # the installed package, not this checkout
    for name in ("lambda", "cosine"):
        run = result[name]
        assert run["lrs"][-1] == 0.0 and run["lrs"][0] == 0.5, run["lrs"]
        assert run["losses"][-1] < run["losses"][0], run["losses"]
        assert run["still"], "a step at lr = 0 moved the weights"
    assert not set(EXTRAS) & set(result["modules"]), set(EXTRAS) & set(result["modules"])


def test_the_attention_svm_solves(env):
    result = env.run("""
        import json, sys
        import numpy as np
        from mdlib import attention_svm
        from mdlib.svm import attention_constraints
        rng = np.random.default_rng(0)
        X, z, alpha = rng.normal(size=(4, 5, 3)), rng.normal(size=(4, 3)), np.zeros(4, dtype=int)
        W = attention_svm(X, z, alpha, 1.5)
        margins = attention_constraints(X, z, alpha) @ W.ravel()
        print(json.dumps({"shape": W.shape, "min": margins.min(),
                          "modules": sorted({m.split(".")[0] for m, v in sys.modules.items() if v is not None})}))
    """)
    assert result["shape"] == [3, 3] and abs(result["min"] - 1) < 1e-8  # the SVM's constraints are tight
    assert not set(EXTRAS) & set(result["modules"]), set(EXTRAS) & set(result["modules"])


PATHS = """
    import json, sysconfig
    from mdlib.experiments import fetch, paths
    root = paths.find_root()
    print(json.dumps({"root": root and str(root), "data": str(fetch.data_dir()), "build": str(paths.build_dir()),
                      "csv": str(paths.data_file("authors_sentences.csv")), "package": str(paths.PACKAGE_DIR),
                      "site": sysconfig.get_paths()["purelib"]}))
"""


def test_installed_paths_stay_out_of_site_packages(env):
    found = env.run(PATHS)
    site, package = Path(found["site"]).resolve(), Path(found["package"])
    assert package.parent == site and found["root"] is None
    assert Path(found["data"]) == env.home / ".cache" / "mdlib"
    assert Path(found["build"]) == env.home / ".cache" / "mdlib" / "build"
    for key in ("data", "build"):
        assert site not in Path(found[key]).parents, found
    assert Path(found["csv"]) == package / "_data" / "authors_sentences.csv"  # read from the wheel
    found = env.run(PATHS, XDG_CACHE_HOME=str(env.home / "xdg"))
    assert Path(found["data"]) == env.home / "xdg" / "mdlib"
    found = env.run(PATHS, MDLIB_ROOT=str(CHECKOUT))  # a checkout named: its folders, read only here
    assert Path(found["root"]) == CHECKOUT and Path(found["data"]) == CHECKOUT / "data" / "cache"
    assert Path(found["csv"]) == CHECKOUT / "data" / "authors_sentences.csv"
    found = env.run(PATHS, cwd=CHECKOUT / "notebooks")  # inside a checkout: found from the working directory
    assert Path(found["root"]) == CHECKOUT and Path(found["build"]) == CHECKOUT / "_build"


def test_the_command_names_the_extra_it_needs(env):
    script = env.python.parent / ("mdlib.exe" if os.name == "nt" else "mdlib")
    done = subprocess.run([str(script), "run", "01_fixed_decoder_paths"], capture_output=True, text=True,
                          cwd=env.outside, env=env.env, timeout=300)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("error: ") and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"pip install '{DISTRIBUTION}[book]'" in done.stderr
