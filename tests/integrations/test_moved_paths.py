"""The integrations moved out of ``rl_llm.trainers.adapters``; the old import paths and entry points still work."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

MODULES = ["generic", "http_client", "http_server", "openenv", "skyrl", "social_seat", "trl", "trl_env",
           "verifiers_env", "verl"]  # fmt: skip


@pytest.mark.parametrize("name", MODULES)
def test_an_old_import_path_is_the_moved_module_itself(name: str) -> None:
    old = importlib.import_module(f"rl_llm.trainers.adapters.{name}")
    assert old is importlib.import_module(f"rl_llm.integrations.{name}")


def test_the_old_package_warns_and_keeps_its_names() -> None:
    sys.modules.pop("rl_llm.trainers.adapters", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = importlib.import_module("rl_llm.trainers.adapters")
    assert any(issubclass(w.category, DeprecationWarning) and "rl_llm.integrations" in str(w.message) for w in caught)
    from rl_llm.integrations import EnvFactory

    assert old.EnvFactory is EnvFactory


@pytest.mark.parametrize("name", ["http_server", "openenv"])
def test_the_old_python_m_entry_points_still_start(name: str) -> None:
    result = subprocess.run([sys.executable, "-m", f"rl_llm.trainers.adapters.{name}", "--help"],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout
