"""The tiers of the distribution: the library needs torch, numpy and scipy alone; each other module
imports only what the extras of its tier install (pyproject.toml), and never looks for a project
unless it needs one."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib

import pytest

from mdlib.book import cli
from mdlib.experiments import paths
from mdlib.runs import identity

PACKAGE = paths.PACKAGE_DIR
CORE = {"torch", "numpy", "scipy"}
#: The tiers, lowest first: the library (mdlib/*.py and mdlib/optim/: pip install attention-mirror-descent),
#: the experiments (mdlib/experiments/ and mdlib/runs/, how their runs are filed and scheduled) and the
#: book (mdlib/book/). ``python -m mdlib`` (mdlib/__main__.py) is the book's command line.
TIERS = ("library", "experiments", "book")


def tier_of(module: str) -> str:
    """The tier of the mdlib module ``module`` ("mdlib.runs.store" -> "experiments")."""
    parts = module.split(".")
    if parts[1:2] in (["experiments"], ["runs"]):
        return "experiments"
    if parts[1:2] == ["book"]:
        return "book"
    return "book" if module == "mdlib.__main__" else "library"


def modules() -> list[str]:
    """Every module of the package, by dotted name."""
    return sorted(".".join(("mdlib", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__")
                  for path in PACKAGE.rglob("*.py"))


#: The extras whose modules a tier may import (numba, extra "fast", is optional everywhere: svm runs without).
EXTRAS_OF_TIER = {"library": set(), "experiments": {"experiments", "cifar", "cluster"},
                  "book": {"experiments", "cifar", "cluster", "book", "test"}}
#: The distribution that brings a module, where the names differ (directly or as a dependency of it).
DISTRIBUTION = {"sklearn": "scikit-learn", "yaml": "pyyaml", "IPython": "ipykernel", "myst_nb": "jupyter-book",
                "jupyter_book": "jupyter-book", "sphinx": "jupyter-book", "nbformat": "jupytext",
                "nbclient": "papermill"}


def _third_party_imports(path) -> set[str]:
    """The top-level names of every import in the file (module level and inside functions), less the
    standard library and mdlib itself."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"mdlib", "__future__"}


def _extras() -> dict[str, set[str]]:
    """pyproject's extras as distribution names, self-references resolved; "": the dependencies."""
    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    raw = {"": project["dependencies"], **project["optional-dependencies"]}

    def names(extra: str) -> set[str]:
        found = set()
        for requirement in raw[extra]:
            name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0).lower()
            if name == project["name"]:
                for inner in re.search(r"\[(.*)\]", requirement).group(1).split(","):
                    found |= names(inner.strip())
            else:
                found.add(name)
        return found

    return {extra: names(extra) for extra in raw}


def test_every_module_imports_only_what_its_tier_installs():
    extras, wrong = _extras(), []
    assert extras[""] == CORE
    for path in sorted(PACKAGE.rglob("*.py")):
        tier = tier_of(".".join(("mdlib", *path.relative_to(PACKAGE).with_suffix("").parts)))
        for name in sorted(_third_party_imports(path) - CORE):
            extra = "fast" if name == "numba" else cli.EXTRA_OF.get(name)
            if extra is None:
                wrong.append(f"{path.relative_to(PACKAGE.parent)} imports {name}, which no extra is known to install (cli.EXTRA_OF)")
            elif extra != "fast" and extra not in EXTRAS_OF_TIER[tier]:
                wrong.append(f"{path.relative_to(PACKAGE.parent)} ({tier}) imports {name} of the extra [{extra}]")
            elif DISTRIBUTION.get(name, name).lower() not in extras[extra]:
                wrong.append(f"the extra [{extra}] lacks {DISTRIBUTION.get(name, name)}, for {name} ({path.relative_to(PACKAGE.parent)})")
    assert not wrong, "\n".join(wrong)


def test_all_is_every_extra():
    extras = _extras()
    assert extras["all"] == set().union(*(v for k, v in extras.items() if k not in ("", "all")))
    assert extras["experiments"] <= extras["book"]


#: What the library tier must not import: the modules of the experiments', the book's and the tests' extras.
HEAVY = ("pandas", "pyarrow", "datasets", "tokenizers", "tqdm", "sklearn", "matplotlib", "seaborn", "yaml",
         "jupytext", "papermill", "jupyter_book", "sphinx", "nbformat", "IPython", "myst_nb", "cvxpy", "torchvision")
#: The book's and the tests' modules, which the experiments must import without.
BOOK_ONLY = ("matplotlib", "seaborn", "yaml", "jupytext", "papermill", "jupyter_book", "sphinx", "nbformat",
             "IPython", "myst_nb", "cvxpy", "torchvision")
LIBRARY_USE = textwrap.dedent("""
    import json, sys
    import torch  # torch.hub imports tqdm, and numba yaml, when they are installed: not mdlib's doing
    try:
        import numba
    except ImportError:
        pass
    loaded = lambda: {name for name, module in sys.modules.items() if module is not None}
    before = loaded()
    import mdlib, mdlib.optim, mdlib.mirror, mdlib.svm, mdlib.models
    from mdlib import LpMirrorDescent, SingleHeadAttention, attention_svm
    torch.manual_seed(0)
    d = 3
    model = SingleHeadAttention(0.01 * torch.randn(1, d, d), torch.randn(1, d))
    X, y, z = torch.randn(1, 4, 5, d), torch.sign(torch.randn(1, 4)), torch.randn(1, 4, d)
    opt = LpMirrorDescent(model.parameters(), lr=0.1, p=1.5)
    for _ in range(3):
        opt.zero_grad()
        model.loss(X, y, z).backward()
        opt.step()
    rng = __import__("numpy").random.default_rng(0)
    Xs, zs = rng.normal(size=(3, 4, d)), rng.normal(size=(3, d))
    W = attention_svm(Xs, zs, __import__("numpy").zeros(3, dtype=int), 1.75)
    print(json.dumps({"modules": sorted({m.split(".")[0] for m in loaded() - before}),
                      "all": sorted({m.split(".")[0] for m in loaded()}), "W": W.tolist(),
                      "finite": bool(torch.isfinite(model.W).all())}))
""")

BLOCK = textwrap.dedent("""
    import sys
    for name in BLOCKED:  # as if not installed: import raises ModuleNotFoundError, find_spec says None
        sys.modules[name] = None
""")


def _library_use(tmp_path, blocked: tuple[str, ...] = ()) -> dict:
    """Run LIBRARY_USE in a fresh interpreter, in a folder that is no project, with $MDLIB_ROOT naming
    a folder that is not one either: any look for a project would raise. "modules": the top-level
    modules that importing and using mdlib added to those of torch (and numba, when installed);
    ``blocked``: modules that cannot be imported there."""
    prelude = f"BLOCKED = {set(blocked)!r}\n{BLOCK}" if blocked else ""
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent), paths.ROOT_ENV: str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", prelude + LIBRARY_USE], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_library_imports_no_extra_and_needs_no_project(tmp_path):
    result = _library_use(tmp_path)
    assert result["finite"]
    assert not set(HEAVY) & set(result["modules"]), set(HEAVY) & set(result["modules"])
    result = _library_use(tmp_path, HEAVY)  # and works with none of them installed
    assert result["finite"] and not set(HEAVY) & set(result["all"])


def test_the_svm_works_without_numba(tmp_path):
    import numpy as np

    from mdlib import svm

    result = _library_use(tmp_path, ("numba", *HEAVY))
    assert "numba" not in result["all"]
    assert not set(HEAVY) & set(result["modules"])
    rng = np.random.default_rng(0)
    X, z = rng.normal(size=(3, 4, 3)), rng.normal(size=(3, 3))
    alpha = np.zeros(3, dtype=int)
    A = svm.attention_constraints(X, z, alpha)
    W = np.array(result["W"])
    assert (A @ W.ravel()).min() >= 1 - 1e-8  # feasible, and the same solution as with numba where it is
    np.testing.assert_allclose(W, svm.attention_svm(X, z, alpha, 1.75), rtol=1e-6, atol=1e-9)


def test_each_tier_imports_only_itself_and_the_tiers_below():
    """Read from the sources, imports inside functions included (``identity.imports``)."""
    wrong = [f"{module} ({tier_of(module)}) imports {other} ({tier_of(other)})"
             for module in modules() for other in sorted(identity.imports(module))
             if TIERS.index(tier_of(other)) > TIERS.index(tier_of(module))]
    assert not wrong, "\n".join(wrong)


#: Reads the results store and judges a results folder with torch blocked (as if not installed).
NO_TORCH = textwrap.dedent("""
    import sys, pathlib
    sys.modules["torch"] = None
    from mdlib.runs import store
    from mdlib.runs.identity import RunId
    from mdlib.book import scorecard
    from mdlib.book.scorecard import rules
    assert store.load(RunId.of("e1-fixed-decoder", {"seeds": 1})) is None and store.entries() == []
    rows = scorecard.rows(pathlib.Path(sys.argv[1]))
    assert rows and all(row.verdict.outcome == rules.NOT_MEASURED for row in rows), rows
    print("torch" in {name for name, module in sys.modules.items() if module is not None})
""")


def test_the_store_and_the_scorecard_need_no_torch(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent), paths.ROOT_ENV: str(tmp_path),
           paths.BUILD_ENV: str(tmp_path / "build")}
    done = subprocess.run([sys.executable, "-c", NO_TORCH, str(results)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]


def test_the_experiments_import_without_the_book(tmp_path):
    experiments = [m for m in modules() if tier_of(m) == "experiments"]
    code = f"BLOCKED = {set(BOOK_ONLY)!r}\n{BLOCK}\nimport " + ", ".join(experiments)
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent), paths.ROOT_ENV: str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=600)
    assert done.returncode == 0, done.stderr


def test_build_outputs_are_ignored_by_git():
    """pip wheel / python -m build leave build/, dist/, *.egg-info and wheels: a record made after them
    must not call the tree dirty."""
    root = PACKAGE.parent
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    names = ["build/lib/mdlib/optim/mirror_descent.py", "dist/attention_mirror_descent-0.1.0-py3-none-any.whl",
             "dist/attention_mirror_descent-0.1.0.tar.gz", "attention_mirror_descent.egg-info/PKG-INFO",
             "attention_mirror_descent-0.1.0-py3-none-any.whl", "data/cache"]
    ignored = subprocess.run(["git", "check-ignore", *names], cwd=root, capture_output=True, text=True)
    assert ignored.stdout.split() == names
    kept = subprocess.run(["git", "check-ignore", "mdlib/optim/mirror_descent.py", "data/authors_sentences.csv"], cwd=root,
                          capture_output=True, text=True)
    assert kept.stdout == ""


def test_the_readme_layout_names_every_module_in_its_folder():
    """The README's Layout section lists every package and module of mdlib on a line of its own, under
    its folder (a folder's line at indentation 0, its modules indented by two under it)."""
    readme = (PACKAGE.parent / "README.md").read_text("utf-8")
    block = readme[readme.index("## Layout"):]
    block = block[block.index("```") + 3:]
    block = block[:block.index("```")]
    listed, parents = set(), {}
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        first = re.split(r"\s{2,}", line.strip())[0]
        if not first or (indent == 0 and not first.startswith("mdlib")):
            parents = {}
            continue
        names = [name.strip() for name in first.split(",")]
        base = [] if indent == 0 else parents.get(indent - 2)
        if base is None:
            continue
        for name in names:
            parts = [*base, *name.strip("/").split("/")]
            listed.add(".".join(parts))
            if name.endswith("/"):
                parents[indent] = parts
    wanted = {m for m in modules() if not m.endswith("__main__")}
    missing = sorted(wanted - listed)
    assert not missing, f"README.md's Layout does not list: {missing}"


def test_every_package_of_mdlib_is_in_the_wheel():
    """pyproject.toml lists its packages by name: a new subpackage left out would be missing from the
    wheel (and only the slow wheel test would see it)."""
    pyproject = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text("utf-8"))
    listed = set(pyproject["tool"]["setuptools"]["packages"])
    found = {".".join(("mdlib", *path.parent.relative_to(PACKAGE).parts)) for path in PACKAGE.rglob("__init__.py")}
    assert found - listed == set(), f"add {sorted(found - listed)} to [tool.setuptools] packages"
