"""rl-llm tool envs as TRL ``environment_factory`` classes: their tools step the real env, their reward is the
env's, and TRL's real ``GRPOTrainer`` trains with one for 2 steps on CPU with the tiny model."""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path
from typing import ClassVar

import gymnasium as gym
import pytest

from rl_llm.envs.terminal.harbor import EXAMPLES_DIR as HARBOR
from rl_llm.integrations.trl_env import (
    ENDED,
    TerminalEnvironment,
    TextToSQLEnvironment,
    ToolCallsEnvironment,
    environment,
    make_tool_dataset,
)
from rl_llm.sandboxes import available_backends


def test_tool_calls_match_the_env_stepped_directly() -> None:
    tools = ToolCallsEnvironment()
    prompt = tools.reset(json.dumps({"seed": 1}))
    reference = gym.make("rl-llm/ToolCalls-v0")
    observation, _ = reference.reset(seed=1)
    assert prompt.startswith(observation) and "`answer`" in prompt
    result = tools.calculator("5149 * 632 - 76398")
    assert str(5149 * 632 - 76398) in result
    expected = reference.step('<tool_call>{"name": "calculator", "arguments": {"expression": "5149 * 632 - 76398"}}</tool_call>')
    assert expected[0] == result
    answer = str(5149 * 632 - 76398)
    assert tools.answer(answer) == ENDED and tools.calculator("1+1") == ENDED  # tools after the end do nothing
    _, reward, terminated, _, _ = reference.step(f"<answer>{answer}</answer>")
    assert terminated and tools.get_reward() == reward > 0
    tools.reset(json.dumps({"seed": 1}))
    assert tools.get_reward() == 0.0  # a new episode starts from zero
    tools.answer("wrong")
    assert tools.get_reward() < reward
    reference.close()


def test_sql_tools_and_factory_kwargs() -> None:
    make = environment("rl-llm/TextToSQL-v0", dataset="chinook")
    sql = make()
    assert isinstance(sql, TextToSQLEnvironment)
    assert "CREATE TABLE" in sql.reset({"seed": 1, "options": {}})
    assert "275" in sql.run_sql("SELECT count(*) FROM Artist")
    with pytest.raises(ValueError, match="no TRL tool environment"):
        environment("rl-llm/TicTacToe-v0")


@pytest.mark.skipif(not [b for b in available_backends() if b != "local"], reason="needs bubblewrap or docker")
def test_terminal_tools_reward_is_the_task_check() -> None:
    from rl_llm.envs.terminal.task import load_task_dir

    task = load_task_dir(HARBOR / "count-errors")
    shell = TerminalEnvironment(tasks=str(HARBOR / "count-errors"), command_timeout_s=20.0)
    try:
        shell.reset(json.dumps({"seed": 0}))
        assert "ERROR" in shell.run("cat server.log")
        shell.run(task.solution[0])  # the oracle script, as one command
        assert shell.finish() == ENDED and shell.get_reward() == 1.0
        shell.reset(json.dumps({"seed": 0}))
        shell.finish()
        assert shell.get_reward() == 0.0
    finally:
        shell._close()


class RecordingSQL(TextToSQLEnvironment):
    """Records what TRL asked of each instance (class-level, since TRL builds the instances)."""

    resets: ClassVar[list[int]] = []
    rewards: ClassVar[list[float]] = []

    def reset(self, rl_llm_task=None, **kwargs):  # type: ignore[no-untyped-def]
        RecordingSQL.resets.append(json.loads(rl_llm_task)["seed"])
        return super().reset(rl_llm_task, **kwargs)

    def get_reward(self) -> float:
        reward = super().get_reward()
        RecordingSQL.rewards.append(reward)
        return reward


def test_grpo_trainer_with_environment_factory(tmp_path: Path) -> None:
    trl = pytest.importorskip("trl")
    pytest.importorskip("datasets")
    import transformers
    from trl.chat_template_utils import qwen2_5_chat_template

    from rl_llm.agents import tiny_model

    if "environment_factory" not in inspect.signature(trl.GRPOTrainer).parameters:
        pytest.skip(f"TRL {trl.__version__} has no environment_factory (needs TRL >= 1.x)")
    model_dir = tiny_model()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    # The tiny model's own template has no tool-calling section; Qwen2.5's (same special tokens) has.
    tokenizer.chat_template = qwen2_5_chat_template
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    args = trl.GRPOConfig(
        output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=2, max_steps=2,
        max_completion_length=12, max_tool_calling_iterations=2, use_cpu=True, report_to="none",
        save_strategy="no", logging_steps=1, learning_rate=1e-2, seed=0,
    )  # fmt: skip
    RecordingSQL.resets.clear()
    RecordingSQL.rewards.clear()
    trainer = trl.GRPOTrainer(
        model=model, processing_class=tokenizer, args=args, train_dataset=make_tool_dataset(range(4)),
        environment_factory=RecordingSQL,
    )  # fmt: skip
    assert {tool.__name__ for tool in trainer.tools} == {"run_sql", "submit_sql"}
    trainer.train()

    assert trainer.state.global_step == 2
    assert len(RecordingSQL.resets) == 4 and set(RecordingSQL.resets) <= set(range(4))
    key = "rewards/RecordingSQL/mean"  # TRL logs an env-owned reward under the env class's name
    logged = [entry[key] for entry in trainer.state.log_history if key in entry]
    assert len(logged) == 2 and len(RecordingSQL.rewards) == 4
    for step, value in enumerate(logged):
        batch = RecordingSQL.rewards[2 * step : 2 * step + 2]
        assert math.isclose(value, sum(batch) / 2, abs_tol=1e-6)  # GRPO's reward is the env's return


def test_an_env_error_ends_the_episode_unscored_and_the_instance_is_reused() -> None:
    """TRL turns a tool's raise into the tool's error message and reuses the instance for later rows: the episode
    must end there (no stepping a broken env), score ``None`` (GRPO leaves it unscored, not a real 0 or partial
    return), and the next ``reset`` must start a clean episode."""

    class Flaky(gym.Wrapper):
        fail = True

        def step(self, action: str):  # type: ignore[no-untyped-def]
            if Flaky.fail:
                raise OSError("sandbox died")
            return self.env.step(action)

    tools = ToolCallsEnvironment()
    tools._env.env = Flaky(tools._env.env)
    tools.reset(json.dumps({"seed": 1}))
    with pytest.raises(RuntimeError, match="sandbox died"):
        tools.calculator("1 + 1")
    Flaky.fail = False
    assert tools.calculator("1 + 1") == ENDED and tools.get_reward() is None
    tools.reset(json.dumps({"seed": 1}))
    assert "2" in tools.calculator("1 + 1") and tools.get_reward() == 0.0
    tools._close()
