"""The Makefile's environment recipe: what ``make book TORCH=...`` hands to pip (``make -n``, read with
pip's own parser; nothing is installed)."""

from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest

from mdlib.experiments import paths

CHECKOUT = paths.PACKAGE_DIR.parent
CUDA_WHEELS = "torch==2.14.1+cu126 torchvision==0.29.1+cu126 --extra-index-url https://download.pytorch.org/whl/cu126"


def pip_install(tmp_path, *variables: str):
    """pip's options and requirements of the ``pip install`` line the recipe of a fresh ``.venv`` runs."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    venv = tmp_path / "venv"
    done = subprocess.run(["make", "-n", "-B", "-C", str(CHECKOUT), f"VENV={venv}", f"{venv}/.mdlib-installed",
                           *variables], capture_output=True, text=True, check=True, timeout=60)
    line, = [line for line in done.stdout.splitlines() if " -m pip install " in line]
    words = shlex.split(line)
    from pip._internal.commands import create_command

    return create_command("install").parse_args(words[words.index("install") + 1:])


def test_torch_chooses_the_wheels_and_adds_an_index_for_them_alone(tmp_path):
    default, requirements = pip_install(tmp_path)
    assert [r.split("==")[0] for r in requirements] == ["torch", "torchvision"] and default.editables == [".[all]"]
    options, requirements = pip_install(tmp_path, f"TORCH={CUDA_WHEELS}")
    assert requirements == ["torch==2.14.1+cu126", "torchvision==0.29.1+cu126"] and options.editables == [".[all]"]
    # an extra index: '.[all]''s other dependencies still come from the package index
    assert options.index_url == default.index_url
    assert options.extra_index_urls == [*default.extra_index_urls, "https://download.pytorch.org/whl/cu126"]
