"""The generic adapter: picklable env factories and the chat-message env interface."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

from rl_llm.integrations import EnvFactory, MessageEnv
from rl_llm.integrations.generic import parse_task

TTT = EnvFactory("rl-llm/TicTacToe-v0", opponent="minimax")


def test_factory_pickles_by_value_and_builds_fresh_envs() -> None:
    clone = pickle.loads(pickle.dumps(TTT))
    assert clone == TTT and hash(clone) == hash(TTT)
    first, second = clone(), clone()
    assert first is not second
    assert first.reset(seed=4) == TTT().reset(seed=4)
    with pytest.raises(ValueError, match="unknown environment"):
        EnvFactory("rl-llm/Nope-v0")()
    with pytest.raises(ValueError, match="non-empty"):
        EnvFactory("")
    # A misspelt option is one clear error before anything is built; gym.make's own options still pass.
    with pytest.raises(ValueError, match="TicTacToe-v0 takes no option 'opponnent'; its options are agent_mark"):
        EnvFactory("rl-llm/TicTacToe-v0", opponnent="minimax")()
    capped = EnvFactory("rl-llm/TicTacToe-v0", opponent="minimax", max_episode_steps=1)()
    capped.reset(seed=0)
    assert capped.step("<move>B2</move>")[3] is True  # truncated by gym.make's TimeLimit after one step


def test_message_env_follows_the_gymnasium_env_turn_by_turn() -> None:
    env, reference = MessageEnv(TTT), TTT()
    messages = env.reset({"seed": 2})
    observation, info = reference.reset(seed=2)
    assert messages == [{"role": "system", "content": info["system_prompt"]}, {"role": "user", "content": observation}]
    done = False
    for move in ["<move>B2</move>", "<move>A1</move>", "<move>A3</move>", "<move>C1</move>", "<move>C3</move>"] * 2:
        messages.append({"role": "assistant", "content": move})
        new_messages, reward, done, step_info = env.step(messages)
        observation, ref_reward, terminated, truncated, ref_info = reference.step(move)
        assert reward == ref_reward and done == (terminated or truncated)
        assert step_info["terminated"] == terminated and step_info["task_id"] == info["task_id"]
        assert step_info["reward_components"] == ref_info["reward_components"]
        assert new_messages == ([] if done else [{"role": "user", "content": observation}])
        messages += new_messages
        if done:
            break
    assert done
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("<move>B2</move>")
    env.close()


def test_step_accepts_the_turn_text_alone_and_rejects_bad_conversations() -> None:
    with MessageEnv(TTT) as env:
        env.reset(7)
        assert env.step("<move>B2</move>")[0]
        with pytest.raises(ValueError, match="empty message list"):
            env.step([])
        with pytest.raises(ValueError, match="assistant"):
            env.step([{"role": "user", "content": "<move>A1</move>"}])
        with pytest.raises(TypeError, match="string"):
            env.step([{"role": "assistant", "content": None}])


def test_an_env_error_mid_step_ends_the_episode_and_reset_starts_the_next() -> None:
    """The env raising inside its step leaves its state unknown: the adapters' callers (SkyRL's loop, a user's
    own) stepped it again on the same episode; now the episode is over, and a bad conversation still is not."""
    from rl_llm.envs.base import Outcome, Task, TextEnv

    class Fragile(TextEnv):
        def _reset(self, options: dict) -> Task:
            return Task("say something", "fragile-0", "test env")

        def _step(self, action: str) -> Outcome:
            if action == "boom":
                raise RuntimeError("the env broke")
            return Outcome("ok", {"r": 1.0})

    with MessageEnv(Fragile(max_turns=5)) as env:
        env.reset(0)
        with pytest.raises(TypeError, match="string"):
            env.step([{"role": "assistant", "content": None}])
        assert env.step("fine")[1] == 1.0  # a refused conversation leaves the episode running
        with pytest.raises(RuntimeError, match="the env broke"):
            env.step("boom")
        assert env.done
        with pytest.raises(RuntimeError, match="call reset"):
            env.step("fine")
        env.reset(1)
        assert env.step("fine")[1] == 1.0


@pytest.mark.parametrize(
    ("task", "expected"),
    [(None, (None, {})), (3, (3, {})), ({"seed": 1, "task_index": 4}, (1, {"task_index": 4})),
     ({"options": {"agent_mark": "X"}}, (None, {"agent_mark": "X"}))],
)  # fmt: skip
def test_task_specs(task: object, expected: tuple) -> None:
    assert parse_task(task) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("task", "error"),
    [(True, TypeError), ("3", TypeError), ({"seed": "1"}, TypeError), ({"level": 2}, ValueError),
     ({"options": [1]}, TypeError)],
)  # fmt: skip
def test_bad_task_specs_are_rejected(task: object, error: type) -> None:
    with pytest.raises(error):
        parse_task(task)  # type: ignore[arg-type]


def test_adapters_import_without_the_optional_extras() -> None:
    """ray, trl and verl stay optional: every adapter module imports with them made unimportable."""
    code = (
        "import sys\n"
        "for name in ('ray', 'trl', 'verl', 'datasets'):\n"
        "    sys.modules[name] = None\n"
        "import rl_llm.integrations, rl_llm.integrations.trl, rl_llm.integrations.verl\n"
        "import rl_llm.integrations.http_client, rl_llm.agents.ray_pool\n"
        "try:\n"
        "    rl_llm.integrations.verl.RLLMAgentLoop\n"
        "except ImportError as error:\n"
        "    assert 'rl-llm[verl]' in str(error)\n"
        "else:\n"
        "    raise AssertionError('RLLMAgentLoop built without verl')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
