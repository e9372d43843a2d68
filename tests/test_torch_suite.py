"""torch's own optimizer tests, ``TestOptimRenewed`` of torch's ``test/test_optim.py``, run for
LpMirrorDescent: set ``MDLIB_TORCH_TEST_OPTIM`` to a copy of that file (torch's source tree, at the tag of
the installed torch; it is not in torch's wheel, and this repository does not copy it). Skipped otherwise.

Our ``OptimizerInfo`` (``tests/lpmd_optim_info.py``) replaces torch's optimizer database while the file is
imported, so its ``@optims(optim_db)`` tests are instantiated for LpMirrorDescent only; the by-design
differences are the OptimizerInfo's named skips. The file's imports of torch's other test modules
(``optim.test_lrscheduler`` and the like, beside it in torch's tree) are stubbed when they are not there:
their tests are not run here. Needs ``expecttest`` (torch's test helpers import it).

    MDLIB_TORCH_TEST_OPTIM=/path/to/pytorch/test/test_optim.py python -m pytest tests/test_torch_suite.py
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import types
from pathlib import Path

import pytest

PATH = os.environ.get("MDLIB_TORCH_TEST_OPTIM")
if not PATH:
    pytest.skip("torch's TestOptimRenewed: set MDLIB_TORCH_TEST_OPTIM to a copy of torch's test/test_optim.py",
                allow_module_level=True)
if not Path(PATH).is_file():
    pytest.skip(f"torch's TestOptimRenewed: MDLIB_TORCH_TEST_OPTIM={PATH} is not a file", allow_module_level=True)
common_optimizers = pytest.importorskip(
    "torch.testing._internal.common_optimizers",
    reason="torch's optimizer test helpers need the expecttest package (pip install expecttest)")

from lpmd_optim_info import LPMD_INFO  # noqa: E402

#: torch's test modules that test_optim.py imports for their test classes (not run here).
SIBLINGS = ("optim.test_lrscheduler", "optim.test_optim", "optim.test_swa_utils")


def _stub(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__getattr__ = lambda attr: type(attr, (), {})  # any imported class: an empty one
    return module


def load_torch_tests(path: str) -> types.ModuleType:
    """Import torch's test file with LpMirrorDescent's OptimizerInfo as the whole optimizer database."""
    database = common_optimizers.optim_db
    saved_db, saved_modules, saved_path = list(database), dict(sys.modules), list(sys.path)
    database[:] = [LPMD_INFO]
    sys.path.insert(0, str(Path(path).parent))  # torch's tree, where its sibling modules live
    try:
        if importlib.util.find_spec("optim") is None:
            sys.modules["optim"] = types.ModuleType("optim")
            for name in SIBLINGS:
                sys.modules[name] = _stub(name)
        loader = importlib.machinery.SourceFileLoader("torch_test_optim", path)
        module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
        loader.exec_module(module)
        return module
    finally:
        database[:] = saved_db
        sys.path[:] = saved_path
        for name in [n for n in sys.modules if n not in saved_modules and (n == "optim" or n.startswith("optim."))]:
            del sys.modules[name]


_torch_tests = load_torch_tests(PATH)
# the device-specific classes instantiate_device_type_tests made (TestOptimRenewedCPU, ...CUDA)
globals().update({name: value for name, value in vars(_torch_tests).items()
                  if name.startswith("TestOptimRenewed") and name != "TestOptimRenewed" and isinstance(value, type)})
