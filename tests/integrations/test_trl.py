"""The TRL adapter: TRL's real GRPOTrainer trains the tiny model on an rl-llm env for two steps on CPU."""

from __future__ import annotations

import math
import os
from typing import Any

import pytest

from rl_llm.agents.tiny import tiny_model
from rl_llm.integrations.generic import EnvFactory
from rl_llm.integrations.trl import (
    TASK_KEY,
    EnvRollout,
    env_reward,
    make_trl_dataset,
    task_of,
    trajectory_to_sample,
)
from rl_llm.types import TokenRole, Trajectory

trl = pytest.importorskip("trl", reason="TRL is an optional extra: pip install 'rl-llm[trl]'")
pytest.importorskip("datasets")
torch = pytest.importorskip("torch")

BANDIT = EnvFactory("rl-llm/MultiArmedBandit-v0", horizon=3)


class RecordingRollout(EnvRollout):
    """The real adapter, keeping every batch it produced so the test can check what TRL was given."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batches: list[tuple[list[Any], list[Trajectory], dict[str, list[Any]]]] = []

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        output = super().__call__(prompts, trainer)
        self.batches.append((prompts, self.last_trajectories, output))
        return output


def brevity(completions: list[Any], **_: Any) -> list[float]:
    """A second, text-dependent reward: the tiny random model's env returns tie within a GRPO group (it never
    emits a valid action, and the env's fallback pull depends only on the seed), so without it the
    advantages, and the update, would be zero."""
    return [-len(str(completion)) / 100.0 for completion in completions]


def replayed_return(trajectory: Trajectory) -> float:
    env = BANDIT()
    env.reset(seed=trajectory.seed)
    total = 0.0
    for turn in trajectory.turns:
        total += env.step(turn.action)[1]
    env.close()
    return total


def test_grpo_trainer_trains_two_steps_with_env_rewards(tmp_path: Any) -> None:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = tiny_model()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    rollout = RecordingRollout(BANDIT, max_new_tokens=8)
    args = trl.GRPOConfig(
        output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=4, max_steps=2,
        use_cpu=True, report_to="none", save_strategy="no", logging_steps=1, learning_rate=1e-2, seed=0,
    )  # fmt: skip
    trainer = trl.GRPOTrainer(
        model=model, processing_class=tokenizer, args=args, train_dataset=make_trl_dataset(BANDIT, range(4)),
        rollout_func=rollout, reward_funcs=[env_reward, brevity],
    )  # fmt: skip
    trainer.train()

    assert trainer.state.global_step == 2 and len(rollout.batches) == 2
    logged = [entry for entry in trainer.state.log_history if "rewards/env_reward/mean" in entry]
    assert len(logged) == 2
    for (prompts, trajectories, output), entry in zip(rollout.batches, logged, strict=True):
        assert len(trajectories) == len(prompts) == 4
        for prompt, trajectory in zip(prompts, trajectories, strict=True):
            assert trajectory.error is None
            assert task_of(prompt)[0] == trajectory.seed
            assert trajectory.total_reward == replayed_return(trajectory)  # the reward is the env's
            assert len(trajectory.turns) == 3  # every episode was played to its end
        # TRL scored with exactly those returns
        assert output["env_reward"] == [t.total_reward for t in trajectories]
        expected = sum(output["env_reward"]) / len(trajectories)
        assert math.isclose(entry["rewards/env_reward/mean"], expected, abs_tol=1e-5)
        # only policy tokens carry loss; they decode to the actions the env received
        for trajectory, ids, mask in zip(trajectories, output["completion_ids"], output["env_mask"], strict=True):
            policy_tokens = [token for token, keep in zip(ids, mask, strict=True) if keep]
            assert policy_tokens == [t for t, r in zip(trajectory.token_ids, trajectory.token_roles) if r == TokenRole.POLICY]
            assert 0 < sum(mask) < len(mask)
    changed = [name for name, p in model.named_parameters() if not torch.equal(p.detach(), before[name])]
    assert changed, "two GRPO steps with non-zero advantages should update the model"


def test_dataset_rows_carry_the_real_opening_and_the_task() -> None:
    dataset = make_trl_dataset(BANDIT, [7, 8], options={"means": [0.1, 0.2, 0.3, 0.4, 0.9]})
    env = BANDIT()
    observation, info = env.reset(seed=7, options={"means": [0.1, 0.2, 0.3, 0.4, 0.9]})
    prompt = dataset[0]["prompt"]
    assert [m["role"] for m in prompt] == ["system", "user"]
    assert prompt[0]["content"] == info["system_prompt"] and prompt[1]["content"] == observation
    assert task_of(prompt) == (7, {"means": [0.1, 0.2, 0.3, 0.4, 0.9]})
    assert task_of(dataset[1]["prompt"])[0] == 8


def test_prompts_without_a_task_are_rejected_clearly() -> None:
    with pytest.raises(ValueError, match="make_trl_dataset"):
        task_of([{"role": "user", "content": "hello"}])
    with pytest.raises(ValueError, match="make_trl_dataset"):
        task_of("plain text prompt")
    with pytest.raises(ValueError, match="unknown task keys"):
        task_of([{"role": "user", "content": "x", TASK_KEY: '{"seed": 1, "level": 3}'}])


def test_trajectory_split_and_reward_function_contract() -> None:
    trajectory = Trajectory(env_id="e", task_id="t", seed=1)
    trajectory.token_ids = [1, 2, 3, 4, 5, 6]
    trajectory.token_roles = [TokenRole.PROMPT, TokenRole.PROMPT, TokenRole.POLICY, TokenRole.POLICY, TokenRole.ENV, TokenRole.POLICY]
    trajectory.logprobs = [0.0, 0.0, -0.5, -0.25, 0.0, -1.0]
    assert trajectory_to_sample(trajectory) == ([1, 2], [3, 4, 5, 6], [1, 1, 0, 1], [-0.5, -0.25, 0.0, -1.0])
    empty = Trajectory(env_id="e", task_id="t", seed=2, error="env.reset failed: boom")
    with pytest.raises(RuntimeError, match="boom"):
        trajectory_to_sample(empty)
    assert env_reward(["a", "b"], env_reward=[1.0, None]) == [1.0, None]
    with pytest.raises(ValueError, match="EnvRollout"):
        env_reward(["a"])
    with pytest.raises(ValueError, match="2 env rewards for 1"):
        env_reward(["a"], env_reward=[1.0, 2.0])
