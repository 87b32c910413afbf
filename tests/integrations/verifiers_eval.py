"""Run verifiers' own ``vf-eval`` (verifiers >= 0.4) on an rl-llm hub package and read back its traces.

verifiers 0.4 and 0.2 cannot share a venv, so the eval may run under another interpreter than the tests:
``RL_LLM_VERIFIERS_PYTHON`` names a Python with verifiers >= 0.4 and rl-llm installed (.ci/run builds one);
without it, the running interpreter is used when it has verifiers.v1. Setting the variable is a promise:
a broken interpreter there fails the test instead of skipping it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from rl_llm.integrations.verifiers_hub import write_hub_package

PROBE = "import verifiers.v1, rl_llm.integrations.verifiers_v1"


def verifiers_python() -> str:
    """A Python that runs verifiers >= 0.4 with rl-llm, or a skip saying how to get one."""
    named = os.environ.get("RL_LLM_VERIFIERS_PYTHON")
    if named:
        probe = subprocess.run([named, "-c", PROBE], capture_output=True, text=True)
        assert probe.returncode == 0, f"RL_LLM_VERIFIERS_PYTHON={named} cannot import verifiers.v1: {probe.stderr[-800:]}"
        return named
    if subprocess.run([sys.executable, "-c", PROBE], capture_output=True).returncode == 0:
        return sys.executable
    pytest.skip("needs verifiers>=0.4 here (pip install 'rl-llm[verifiers]') or RL_LLM_VERIFIERS_PYTHON naming "
                "a Python that has it (verifiers 0.4 and 0.2 cannot share one venv)")


def run_vf_eval(python: str, env_id: str, env_kwargs: dict[str, Any], tmp_path: Path, base_url: str, model: str,
                num_tasks: int, rollouts: int, max_tokens: int) -> list[dict[str, Any]]:  # fmt: skip
    """Write the hub package for ``env_id``, run ``vf-eval`` on it against ``base_url`` and return the traces
    (one per episode: the agent's seat), each episode having ended without error."""
    package = write_hub_package(env_id, tmp_path / "environments", **env_kwargs)
    out = tmp_path / "outputs"
    vf_eval = Path(python).parent / "vf-eval"
    environ = {**os.environ, "PYTHONPATH": str(package), "RL_LLM_TEST_KEY": "unused",
               # the null harness's chat program is prepared with uv: the one next to this Python first
               "PATH": f"{Path(python).parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # fmt: skip
    command = [str(vf_eval), package.name.replace("_", "-"), "-n", str(num_tasks), "-r", str(rollouts),
               "--model", model, "--client.base-url", base_url, "--client.api-key-var", "RL_LLM_TEST_KEY",
               "--sampling.max-tokens", str(max_tokens), "--no-push", "--no-rich", "-o", str(out),
               "--run.name", "test"]  # fmt: skip
    done = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, f"vf-eval failed ({done.returncode}):\n{done.stderr[-4000:]}"
    lines = (out / "test" / "traces.jsonl").read_text().splitlines()
    episodes = [json.loads(line) for line in lines if line.strip()]  # one episode a line, its traces inside
    assert len(episodes) == num_tasks * rollouts, done.stderr[-2000:]
    for episode in episodes:
        assert episode["ok"] and not episode["errors"], (episode["errors"], done.stderr[-2000:])
    return [trace for episode in episodes for trace in episode["traces"]]


def assistant_turns(trace: dict[str, Any]) -> list[str]:
    """The model's turns of a trace, in order, as the env received them."""
    texts = []
    for node in trace["nodes"]:
        message = node["message"]
        if message.get("role") == "assistant":
            content = message.get("content") or ""
            texts.append(content if isinstance(content, str) else "".join(p.get("text", "") for p in content))
    return texts


def replay(env_id: str, env_kwargs: dict[str, Any], seed: int, actions: list[str]) -> tuple[float, bool]:
    """The return the env gives ``actions`` when stepped directly, and whether the episode ended."""
    from rl_llm.integrations.social_seat import make_env

    env: gym.Env = make_env(env_id, **env_kwargs)
    env.reset(seed=seed)
    total, done = 0.0, False
    for action in actions:
        assert not done, "the trace has turns after the env ended the episode"
        _, reward, terminated, truncated, _ = env.step(action)
        total, done = total + float(reward), terminated or truncated
    return total, done
