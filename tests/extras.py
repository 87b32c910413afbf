"""Optional extras in tests: a test of an adapter skips where its framework is not installed, and fails where
the run says the extra must be there, so a skip never hides a broken install.

``RL_LLM_REQUIRE_EXTRAS`` (comma-separated names; .ci/run sets it to the extras it installed) lists what must
import: for those, ``import_extra`` imports the module outright and an ImportError fails the test file.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def required_extras() -> set[str]:
    return {name.strip() for name in os.environ.get("RL_LLM_REQUIRE_EXTRAS", "").split(",") if name.strip()}


def import_extra(module: str, extra: str, install: str) -> ModuleType:
    """``module``, or a skip naming ``install`` when it is missing and ``extra`` is not required here."""
    if extra in required_extras():
        try:
            return importlib.import_module(module)
        except ImportError as error:
            raise ImportError(f"RL_LLM_REQUIRE_EXTRAS names {extra!r}, but {module} does not import: {error}") from error
    return pytest.importorskip(module, reason=f"needs {install}")
