"""The integrations moved out of ``rl_llm.trainers.adapters``; the old import paths and entry points still work."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

from tests.extras import import_extra, required_extras

MODULES = ["generic", "http_client", "http_server", "openenv", "skyrl", "social_seat", "trl", "trl_env",
           "verifiers_env", "verl"]  # fmt: skip
# Modules that import their framework at the top: (framework module, extra, install command).
FRAMEWORKS = {
    "openenv": ("openenv", "openenv", "pip install 'rl-llm[openenv]'"),
    "skyrl": ("skyrl_gym", "skyrl", "pip install 'rl-llm[skyrl]'"),
    "verifiers_env": ("verifiers", "verifiers02", "pip install 'verifiers>=0.2,<0.3' 'datasets>=3'"),
}


def needs_framework(name: str) -> None:
    """Skip where the module's framework is missing or another release of it is installed (e.g. verifiers 0.4
    for the 0.2 adapter); a failure where the run requires the extra (tests/extras.py)."""
    if name not in FRAMEWORKS:
        return
    framework, extra, install = FRAMEWORKS[name]
    import_extra(framework, extra, install)
    try:
        importlib.import_module(f"rl_llm.integrations.{name}")
    except ImportError as error:
        if extra in required_extras():
            raise
        pytest.skip(f"rl_llm.integrations.{name} does not import here ({error}); {install}")


@pytest.mark.parametrize("name", MODULES)
def test_an_old_import_path_is_the_moved_module_itself(name: str) -> None:
    needs_framework(name)
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
    needs_framework(name)
    result = subprocess.run([sys.executable, "-m", f"rl_llm.trainers.adapters.{name}", "--help"],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout
