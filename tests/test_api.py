"""The public API: ``from mdlib import ...`` for the library tier (optimizer, mirror maps, SVM solvers,
models), loaded lazily, fully annotated, and typed (``py.typed``)."""

import importlib
import inspect
import pkgutil
import subprocess
import sys

import pytest

import mdlib

#: The library tier: the modules whose public names make up ``mdlib.__all__``.
LIBRARY = ("mdlib.optim", "mdlib.mirror", "mdlib.svm", "mdlib.models")


def test_public_names_resolve_to_their_modules():
    assert len(mdlib.__all__) == len(set(mdlib.__all__))
    for name in mdlib.__all__:
        module = importlib.import_module(mdlib._MODULE_OF[name])
        assert module.__name__ in LIBRARY
        assert name in module.__all__, (name, module.__name__)
        assert getattr(mdlib, name) is getattr(module, name)
        assert name in dir(mdlib)
    from mdlib import LpMirrorDescent, attention_svm  # noqa: F401  (the issue's spelling)
    namespace: dict = {}
    exec("from mdlib import *", namespace)
    assert set(mdlib.__all__) <= namespace.keys()


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'LpMirrorDecent'"):
        mdlib.LpMirrorDecent  # noqa: B018
    from mdlib import mirror  # a submodule still imports as one
    assert mirror.__name__ == "mdlib.mirror"


def test_importing_the_package_loads_no_array_library():
    code = ("import sys, mdlib; print(sorted(m for m in ('torch', 'numpy', 'scipy') if m in sys.modules)); "
            "mdlib.LpMirrorDescent; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]", "True"]


def _public_callables(modules=LIBRARY, public=lambda module: module.__all__):
    for module_name in modules:
        module = importlib.import_module(module_name)
        for name in public(module):
            obj = getattr(module, name)
            if inspect.isclass(obj):
                for attr, value in vars(obj).items():
                    if inspect.isfunction(value) and (attr == "__init__" or not attr.startswith("_")):
                        yield f"{module_name}.{name}.{attr}", value
            elif inspect.isfunction(obj):
                yield f"{module_name}.{name}", obj


def _every_module():
    return [f"mdlib.{info.name}" for info in pkgutil.iter_modules(mdlib.__path__) if info.name != "__main__"]


def _defined_here(module):
    return [name for name, value in vars(module).items()
            if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__]


@pytest.mark.parametrize("scope", ["library", "every module"])
def test_public_functions_are_fully_annotated(scope):
    """The library's API, and every public function and method of every mdlib module."""
    found = _public_callables() if scope == "library" else _public_callables(_every_module(), _defined_here)
    missing = []
    for qualname, function in found:
        signature = inspect.signature(function)
        missing += [f"{qualname}({parameter})" for parameter, value in signature.parameters.items()
                    if parameter not in ("self", "cls") and value.annotation is inspect.Parameter.empty]
        if signature.return_annotation is inspect.Signature.empty and not qualname.endswith(".__init__"):
            missing.append(f"{qualname} -> ?")
    assert not missing, missing


def test_typed_marker_ships_with_the_package():
    from importlib.resources import files

    assert files("mdlib").joinpath("py.typed").is_file()


def test_api_page_builds_from_the_docstrings_without_warnings(tmp_path):
    """book/api.md alone, with the book's autodoc and napoleon settings, rendered by Sphinx with
    warnings as errors (as the book build runs): every documented name exists and every docstring is
    valid reStructuredText."""
    import yaml

    from mdlib.experiments import paths

    sphinx = yaml.safe_load((paths.root() / "_config.yml").read_text("utf-8"))["sphinx"]
    assert {"sphinx.ext.autodoc", "sphinx.ext.napoleon"} <= set(sphinx["extra_extensions"])
    settings = {key: value for key, value in sphinx["config"].items() if key.startswith(("autodoc_", "napoleon_"))}
    source = tmp_path / "src"
    source.mkdir()
    (source / "index.md").write_text((paths.book_dir() / "api.md").read_text("utf-8"), "utf-8")
    (source / "conf.py").write_text(
        "extensions = ['myst_parser', 'sphinx.ext.autodoc', 'sphinx.ext.napoleon', 'sphinx.ext.mathjax']\n"
        "myst_enable_extensions = ['dollarmath', 'amsmath']\n"
        + "".join(f"{key} = {value!r}\n" for key, value in settings.items()), "utf-8")
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(source),
                           str(tmp_path / "html")], capture_output=True, text=True, cwd=paths.root())
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "html" / "index.html").read_text("utf-8")
    for name in ("LpMirrorDescent", "attention_svm", "VisionTransformer", "bregman_divergence"):
        assert f'id="mdlib.{name}"' in page, name
