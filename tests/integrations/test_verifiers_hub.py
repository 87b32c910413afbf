"""Environments Hub packages of rl-llm envs (integrations/verifiers_hub.py), and verifiers' own ``vf-eval``
(verifiers >= 0.4) playing one against the real vLLM CPU server of the tiny model, each rollout's reward being
the env's return for the turns the model played. The eval may run under another Python
(RL_LLM_VERIFIERS_PYTHON, tests/integrations/verifiers_eval.py): verifiers 0.4 and 0.2 cannot share a venv."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rl_llm.integrations.verifiers_hub import all_env_ids, hub_name, main, write_hub_package
from tests.integrations.verifiers_eval import assistant_turns, replay, run_vf_eval, verifiers_python

BANDIT = "rl-llm/MultiArmedBandit-v0"


def test_package_names_follow_the_hub_convention() -> None:
    assert hub_name("rl-llm/TicTacToe-v0") == "rl-llm-tic-tac-toe"
    assert hub_name("rl-llm/TextToSQL-v0") == "rl-llm-text-to-sql"
    assert hub_name("social/prisoners_dilemma_v0") == "rl-llm-prisoners-dilemma"
    names = [hub_name(env_id) for env_id in all_env_ids()]
    assert len(set(names)) == len(names)  # one module name per env: none shadows another


def test_written_package_is_installable_metadata_and_binds_the_env(tmp_path: Path) -> None:
    tomllib = pytest.importorskip("tomllib", reason="reading TOML needs Python >= 3.11")
    root = write_hub_package(BANDIT, tmp_path, horizon=3)
    assert root == tmp_path / "rl_llm_multi_armed_bandit"
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert project["project"]["name"] == "rl-llm-multi-armed-bandit"
    assert project["project"]["dependencies"] == ["rl-llm[verifiers]"]
    assert project["tool"]["setuptools"]["packages"] == ["rl_llm_multi_armed_bandit"]
    module = (root / "rl_llm_multi_armed_bandit" / "__init__.py").read_text()
    compile(module, "__init__.py", "exec")
    assert "ENV_ID = 'rl-llm/MultiArmedBandit-v0'" in module and '{"horizon": 3}' in module


def test_bad_input_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="unknown environment"):
        write_hub_package("rl-llm/Nope-v0", tmp_path)
    with pytest.raises(ValueError, match="lowercase"):
        write_hub_package(BANDIT, tmp_path, name="Bad Name")
    assert not any(tmp_path.iterdir())  # nothing half-written
    assert main(["--env", "rl-llm/Nope-v0", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown environment") and err.count("\n") == 1
    assert main(["--env", BANDIT, "-k", "horizon", "--out", str(tmp_path)]) == 2
    assert "key=value" in capsys.readouterr().err


def test_all_writes_one_package_per_env(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--all", "--out", str(tmp_path)])
    written = {path.name for path in tmp_path.iterdir()}
    skipped = capsys.readouterr().err.count("skipped ")
    assert len(written) + skipped == len(all_env_ids()) and code == (1 if skipped else 0)
    assert {"rl_llm_tic_tac_toe", "rl_llm_prisoners_dilemma"} <= written


@pytest.fixture(scope="session")
def vf_python() -> str:
    """Requested before the vLLM server, so a machine without verifiers 0.4 skips without starting one."""
    return verifiers_python()


def test_vf_eval_against_a_real_vllm_server(vf_python: str, vllm_server: Any, tmp_path: Path) -> None:
    kwargs = {"horizon": 3}
    traces = run_vf_eval(vf_python, BANDIT, kwargs, tmp_path, f"{vllm_server.url}/v1", vllm_server.model,
                         num_tasks=2, rollouts=2, max_tokens=8)  # fmt: skip
    assert sorted(trace["task"]["data"]["seed"] for trace in traces) == [0, 0, 1, 1]
    for trace in traces:
        actions = assistant_turns(trace)
        assert len(actions) == 3  # every rollout ran the env to its end: 3 pulls
        total, ended = replay(BANDIT, kwargs, trace["task"]["data"]["seed"], actions)
        assert ended and trace["stop_condition"] == "env_done"
        assert trace["rewards"]["rl_llm_return"]["score"] == pytest.approx(total)
        assert trace["metrics"]["env_turns"] == 3
