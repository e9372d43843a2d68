"""Runs are keyed by the code that computes them: an edit of that code is recomputed, never served the
stored numbers of the old code, and the provenance record names the code it came from."""

import ast
import functools
import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mdlib.experiments import paths
from mdlib.runs import identity, store
from mdlib.runs.identity import RunId

E1 = dict(seeds=2, steps={"1.75": 4, "3": 5}, lr=0.1, n=3, T=4, d=3, svm_ps=[1.75, 3.0], seed=0, eps=None, points=3)
SCRIPT = f"""
import json, sys
from mdlib.book import provenance
from mdlib.experiments import synthetic
from mdlib.runs import identity, store
result = synthetic.fixed_decoder_experiment({E1!r})
print(json.dumps({{"cached": result.cached, "key": result.key, "final": result["final"].divergence.tolist(),
                  "code": identity.code_of(synthetic.E1_KIND), "record": provenance.record("t", "table")["code"],
                  "package": identity.fingerprint()}}))
"""
EDIT = ("path = train(data, float(p), int(p_steps), lr, W0,", "path = train(data, float(p), int(p_steps), 0.5 * lr, W0,")


@pytest.fixture
def checkout(tmp_path):
    """A copy of the mdlib package (to edit) and a build folder of its own."""
    shutil.copytree(identity._ROOT, tmp_path / "src" / "mdlib",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def run_e1(checkout) -> dict:
    env = dict(os.environ, PYTHONPATH=str(checkout / "src"), **{paths.BUILD_ENV: str(checkout / "build")})
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=checkout, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def edit(checkout, module: str, old: str, new: str) -> None:
    """Replace ``old`` by ``new`` in the copy's module ``module`` ("experiments.synthetic")."""
    path = checkout / "src" / "mdlib" / f"{module.replace('.', '/')}.py"
    text = path.read_text("utf-8")
    assert text.count(old) == 1, f"{module}.py no longer has {old!r}: update the test's edit"
    path.write_text(text.replace(old, new), "utf-8")


def test_an_edited_computation_is_recomputed_and_a_revert_reads_the_old_entry_back(checkout):
    first = run_e1(checkout)
    assert not first["cached"] and run_e1(checkout)["cached"]
    edit(checkout, "experiments.synthetic", *EDIT)  # one line of the experiment's arithmetic
    edited = run_e1(checkout)
    assert not edited["cached"], "the store served numbers of the code before the edit"
    assert edited["key"] != first["key"] and edited["final"] != first["final"]
    assert edited["code"] != first["code"] and edited["record"] != first["record"]  # the record names the new code
    edit(checkout, "experiments.synthetic", EDIT[1], EDIT[0])  # reverted: the entry of the original code, its numbers
    reverted = run_e1(checkout)
    assert reverted["cached"] and reverted["key"] == first["key"] and reverted["final"] == first["final"]
    assert reverted["record"] == first["record"]
    # both entries stay on disk, one per fingerprint
    assert len([p for p in (checkout / "build" / "runs" / "e1-fixed-decoder").iterdir()
                if not p.name.startswith(".")]) == 2


def test_an_edit_outside_the_experiments_imports_keeps_its_runs(checkout):
    first = run_e1(checkout)
    assert "mdlib.book.scorecard.claims" not in identity.closure("mdlib.experiments.synthetic")
    path = checkout / "src" / "mdlib" / "book" / "scorecard" / "claims.py"  # a module E1 never imports
    path.write_text(path.read_text("utf-8") + "\n# edited\n", "utf-8")
    again = run_e1(checkout)
    assert again["cached"] and again["key"] == first["key"]
    assert again["package"] != first["package"]  # the record's package fingerprint still names the edit


def test_a_function_level_import_counts(tmp_path, monkeypatch):
    # methods imports the optimizer inside make_optimizer only (it stays torch-free at import); the
    # optimizer's code is part of the fingerprint of every experiment that builds one through it
    assert "mdlib.optim" in identity.imports("mdlib.experiments.methods")
    assert "mdlib.optim" in identity.closure("mdlib.experiments.sentiment")
    assert identity.fingerprint("mdlib.experiments.sentiment") != identity.fingerprint("mdlib.experiments.synthetic")
    with pytest.raises(ValueError, match="not a module of mdlib"):
        identity.fingerprint("numpy")


def test_every_module_of_the_optimizer_package_is_in_the_closure_of_a_kind_that_trains_with_it():
    """``mdlib.optim`` is a package: its ``__init__`` re-exports the optimizer, and the implementation lives
    in the modules beside it, each of which is arithmetic of every run that steps the optimizer."""
    package = identity.source_file("mdlib.optim").parent
    modules = {f"mdlib.optim.{path.stem}" for path in package.glob("*.py") if path.stem != "__init__"}
    assert modules and modules <= identity.closure(identity.KINDS["e4-sentiment"])


def test_store_lists_and_prunes_entries_of_other_code(tmp_path, monkeypatch):
    monkeypatch.setenv(paths.BUILD_ENV, str(tmp_path))
    now = store.save(RunId.of("prune-test", {"n": 1}), {"x": 1})
    old = store.save(RunId.of("prune-test", {"n": 2}), {"x": 2})
    meta = json.loads((old / "meta.json").read_text("utf-8"))
    (old / "meta.json").write_text(json.dumps(meta | {"code": "0" * 64}), "utf-8")  # computed by other code
    with pytest.warns(store.StoreWarning, match="computed by other code"):
        assert store.load(RunId.of("prune-test", {"n": 2})) is None  # never served
    found = {e.path: e.current for e in store.entries()}
    assert found == {now: True, old: False}
    from mdlib.book import cli

    assert cli.main(["store", "--prune"]) == 0
    assert now.is_dir() and not old.exists()
    assert store.load(RunId.of("prune-test", {"n": 1}))["x"] == 1


PRUNE = """
import json, sys
from mdlib.book import cli
from mdlib.runs import identity
code = cli.main(["store", "--prune"])
print(json.dumps({"exit": code, "imported": sorted(set(identity.KINDS.values()) & set(sys.modules))}))
"""


def test_store_prune_knows_each_kinds_code_without_importing_its_module(tmp_path):
    """``python -m mdlib store --prune`` keeps a chapter's entries of today's code and removes the others,
    in a process that imports no experiment module (the kinds' table names their code)."""
    env = dict(os.environ, PYTHONPATH=str(identity._ROOT.parent), **{paths.BUILD_ENV: str(tmp_path)})
    save = ("from mdlib.runs import store\nfrom mdlib.runs.identity import RunId\n"
            "for n in (1, 2):\n    print(store.save(RunId.of('e1-fixed-decoder', {'n': n}), {'x': n}))")
    out = subprocess.run([sys.executable, "-c", save], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    now, old = (Path(line) for line in out.stdout.split())
    meta = json.loads((old / "meta.json").read_text("utf-8"))
    (old / "meta.json").write_text(json.dumps(meta | {"code": "0" * 64}), "utf-8")  # computed by other code
    out = subprocess.run([sys.executable, "-c", PRUNE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    *listing, last = out.stdout.strip().splitlines()
    assert json.loads(last) == {"exit": 0, "imported": []}
    assert "  e1-fixed-decoder: 1 from today's code" in listing[1] and "1 from other code" in listing[1]
    assert now.is_dir() and not old.exists()


def test_a_kind_is_declared_by_the_module_the_table_names():
    assert identity.kind("e1-fixed-decoder", "mdlib.experiments.synthetic") == "e1-fixed-decoder"
    assert identity.kind("e1-fixed-decoder", "mdlib.experiments.synthetic") == "e1-fixed-decoder"  # a re-import
    with pytest.raises(ValueError, match=r"'e1-fixed-decoder' is computed by mdlib.experiments.synthetic "
                                         r"\(mdlib.runs.identity.KINDS\); mdlib.experiments.vision must use"):
        identity.kind("e1-fixed-decoder", "mdlib.experiments.vision")
    with pytest.raises(ValueError, match=r"'kind-test' is not in mdlib.runs.identity.KINDS: add it there"):
        identity.kind("kind-test", "mdlib.experiments.synthetic")


def _declared_kinds() -> dict[str, str]:
    """{kind: module} of every ``kind("name", __name__)`` call in mdlib's sources, read statically."""
    found = {}
    for path in sorted(identity._ROOT.rglob("*.py")):
        module = ".".join(("mdlib", *path.relative_to(identity._ROOT).with_suffix("").parts)).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            name = getattr(node, "func", None)
            if (isinstance(node, ast.Call) and getattr(name, "attr", getattr(name, "id", None)) == "kind"
                    and len(node.args) == 2 and isinstance(node.args[1], ast.Name) and node.args[1].id == "__name__"):
                assert isinstance(node.args[0], ast.Constant), f"{path}: a kind is declared by its literal name"
                found[node.args[0].value] = module
    return found


def test_the_table_holds_exactly_the_kinds_the_modules_declare():
    declared = _declared_kinds()
    assert len(declared) >= 11  # the e1-e3, e4, e7 and e9 kinds: the search still finds the declarations
    assert dict(identity.KINDS) == declared


def test_the_code_of_a_kind_needs_no_import_of_its_module():
    """A process that imports only the store knows every kind's code: the same as after importing its module."""
    script = ("import json, sys\nfrom mdlib.runs import identity, store\n"
              "codes = {kind: identity.code_of(kind) for kind in identity.KINDS}\n"
              "print(json.dumps({'codes': codes, 'imported': sorted(set(identity.KINDS.values()) & set(sys.modules))}))")
    env = dict(os.environ, PYTHONPATH=str(identity._ROOT.parent))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    fresh = json.loads(out.stdout)
    assert fresh["imported"] == []
    for module in set(identity.KINDS.values()):
        importlib.import_module(module)
    assert fresh["codes"] == {kind: identity.code_of(kind) for kind in identity.KINDS}
    assert fresh["codes"]["e4-sentiment"] == identity.fingerprint("mdlib.experiments.sentiment.run") != identity.fingerprint()
    assert identity.code_of("toy") == identity.fingerprint()  # a kind not in the table: all of mdlib


def test_a_public_name_counts_as_its_module_and_neither_package_inits_nor_type_checking_imports_do(tmp_path, monkeypatch):
    package = tmp_path / "mdlib"
    package.mkdir()
    (package / "experiments").mkdir()
    for name in ("__init__", "optim", "svm", "experiments/__init__", "experiments/stats"):
        (package / f"{name}.py").write_text("")
    (package / "user.py").write_text("from typing import TYPE_CHECKING\nfrom mdlib import LpMirrorDescent\n"
                                     "if TYPE_CHECKING:\n    from mdlib import svm\nelse:\n    import mdlib.experiments.stats\n")
    monkeypatch.setattr(identity, "_ROOT", package)
    identity._source.cache_clear()
    try:
        assert identity.imports("mdlib.user") == {"mdlib.optim", "mdlib.experiments.stats"}
    finally:
        identity._source.cache_clear()


def _codes_with(monkeypatch, module: str, old: str, new: str) -> dict[str, str]:
    """{kind: code_of(kind)} with ``module``'s source edited in memory (``old`` -> ``new``, once)."""
    real = identity._source.__wrapped__

    def edited(name: str) -> bytes:
        text = real(name)
        if name != module:
            return text
        assert text.count(old.encode()) == 1, f"{module} no longer has {old!r}: update the test's edit"
        return text.replace(old.encode(), new.encode())

    for cached in (identity._source, identity.arithmetic, identity.fingerprint):
        cached.cache_clear()
    monkeypatch.setattr(identity, "_source", functools.lru_cache(maxsize=None)(edited))
    try:
        return {kind: identity.code_of(kind) for kind in identity.KINDS}
    finally:
        monkeypatch.undo()
        for cached in (identity._source, identity.arithmetic, identity.fingerprint):
            cached.cache_clear()


#: Edits that change no number: a lock's timeout, a pool's message, a view, the paper's numbers, prose.
KEPT = [("mdlib.runs.lockfile", "LOCK_TIMEOUT_MINUTES = 10.0", "LOCK_TIMEOUT_MINUTES = 12.0"),
        ("mdlib.runs.pool", "failed and is skipped", "failed, skipped"),
        ("mdlib.experiments.paths", "def is_project(", "def _unused():\n    pass\n\n\ndef is_project("),
        ("mdlib.experiments.paper", "STOP_TRAIN_ACCURACY = 0.995", "STOP_TRAIN_ACCURACY = 0.99"),
        ("mdlib.experiments.train", '"""The training loop', '"""The training loop, documented'),
        ("mdlib.experiments.train", "\nimport math\n", "\nimport math  # a comment\nimport math\n")]
#: Edits of the arithmetic, and the kinds whose runs they change (at least).
CHANGED = [("mdlib.experiments.train", "F.binary_cross_entropy_with_logits(", "2 * F.binary_cross_entropy_with_logits(",
            {"e4-sentiment", "e7-vit", "e9-step-sizes"}),
           ("mdlib.optim._steps", "def _real(", "STEP_EDITED = 1\n\n\ndef _real(", {"e4-sentiment", "e7-vit", "e9-step-sizes"}),
           ("mdlib.models", "nn.init.normal_(self.token.weight, std=std)", "nn.init.normal_(self.token.weight, std=2 * std)",
            {"e4-sentiment", "e7-vit", "e9-step-sizes", "e1-fixed-decoder"})]


@pytest.mark.parametrize("module, old, new", KEPT)
def test_an_edit_that_computes_nothing_keeps_every_kinds_code(monkeypatch, module, old, new):
    """Locks, the pool, paths, the paper's numbers, docstrings, comments and imports are not a run's
    arithmetic: no key of any kind moves (so no stored run is trained again)."""
    assert _codes_with(monkeypatch, module, old, new) == {kind: identity.code_of(kind) for kind in identity.KINDS}


@pytest.mark.parametrize("module, old, new, kinds", CHANGED)
def test_an_edit_of_the_arithmetic_changes_the_code_of_the_kinds_it_computes(monkeypatch, module, old, new, kinds):
    """The training loss, the optimizer's update, a model's initialization: every kind whose runs use them
    gets a new code (its stored runs are trained again), the others keep theirs."""
    before = {kind: identity.code_of(kind) for kind in identity.KINDS}
    after = _codes_with(monkeypatch, module, old, new)
    changed = {kind for kind in before if after[kind] != before[kind]}
    assert kinds <= changed
    assert changed == {kind for kind in identity.KINDS if module in identity.closure(identity.KINDS[kind])}


def test_the_arithmetic_of_a_module_drops_prose_and_imports_only():
    text = identity.arithmetic("mdlib.experiments.train")
    assert "def fit(" in text and '"""' not in text
    assert not [line for line in text.splitlines() if line.lstrip().startswith(("import ", "from "))]
    assert "#" not in "".join(line.split('"')[0] for line in text.splitlines())


def test_no_run_kinds_module_holds_presentation():
    """Views and sentences (``*_view``, ``*_text``, ``*_reading``) live in the book tier: in a run kind's
    module an edit of a table's look would retrain its runs."""
    for module in sorted(set(identity.KINDS.values())):
        tree = ast.parse(identity.source_file(module).read_text("utf-8"))
        shown = [node.name for node in tree.body if isinstance(node, ast.FunctionDef)
                 and node.name.endswith(("_view", "_text", "_reading"))]
        assert not shown, f"{module} defines presentation {shown}: move it to mdlib.book"
