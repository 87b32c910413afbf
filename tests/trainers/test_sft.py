"""The warm-start stage (trainers/sft.py): expert episodes recorded like RL rollouts, and SFT that learns them."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rl_llm.agents.hf import HFPolicy
from rl_llm.agents.llm import SamplingParams
from rl_llm.agents.tiny import tiny_model
from rl_llm.trainers.batch import collate
from rl_llm.trainers.config import ConfigError, load_config
from rl_llm.trainers.evaluation import evaluate_llm
from rl_llm.trainers.runner import env_factory
from rl_llm.trainers.sft import expert_nll, expert_trajectories, sft, template_content
from rl_llm.types import TokenRole
from tests.cli_env import cli_env

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tictactoe_grpo_cpu.yaml"
TTT = "rl-llm/TicTacToe-v0"


def test_shipped_config_loads_and_validates() -> None:
    config = load_config(CONFIG)
    assert config.env.id == TTT and config.env.kwargs["opponent"] == "random"
    assert config.env.action_template == "<move>{}</move>" and config.env.kwargs["cell_names"] == "numbers"
    assert config.rollout.max_new_tokens == 1  # a move is one token: the cell's number
    assert config.model.path == "tiny" and config.rollout.backend == "hf"
    assert config.sft.episodes > 0 and config.sft.baseline == "minimax"
    # Expert, training and held-out seeds never overlap.
    expert = range(config.sft.seed, config.sft.seed + config.sft.episodes + config.sft.held_out_episodes)
    evaluation = range(config.eval.seed, config.eval.seed + config.eval.episodes)
    training = range(
        config.env.train_seed, config.env.train_seed + config.steps * config.rollout.prompts_per_step
    )
    assert (
        not set(expert) & set(evaluation)
        and not set(expert) & set(training)
        and not set(training) & set(evaluation)
    )
    with pytest.raises(ConfigError, match=r"sft\.episodes"):
        load_config(CONFIG, ["sft.episodes=-1"])
    with pytest.raises(ConfigError, match=r"sft\.epochs"):
        load_config(CONFIG, ["sft.epochs=0"])


@pytest.fixture(scope="module")
def setting():
    config = load_config(CONFIG)
    path = tiny_model()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    return config, path, tokenizer, env_factory(config)


def test_expert_episodes_are_recorded_like_rollouts(setting) -> None:
    config, _, tokenizer, make_env = setting
    trajectories = expert_trajectories(
        make_env, tokenizer, TTT, "minimax", list(range(500, 508)), config.env.action_template
    )
    assert len(trajectories) == 8
    for trajectory in trajectories:
        assert trajectory.error is None and trajectory.terminated
        assert (
            trajectory.metrics["illegal_moves"] == 0 and trajectory.metrics["loss"] == 0
        )  # minimax never loses
        roles = trajectory.token_roles
        assert roles[0] == TokenRole.PROMPT and len(roles) == len(trajectory.token_ids) == len(
            trajectory.logprobs
        )
        for turn in trajectory.turns:
            # The template's content only (as the RL generator writes it), tokenized as POLICY tokens.
            assert len(turn.action) == 1 and turn.action in "123456789"  # cell_names: numbers
            ids = trajectory.token_ids[turn.token_start : turn.token_end]
            assert tokenizer.decode(ids) == turn.action
            assert all(role == TokenRole.POLICY for role in roles[turn.token_start : turn.token_end])
    # Reproducible whatever the batching: the expert's ties are drawn per (episode seed, turn).
    again = expert_trajectories(
        make_env, tokenizer, TTT, "minimax", list(range(507, 499, -1)), "<move>{}</move>"
    )
    assert [t.token_ids for t in again[::-1]] == [t.token_ids for t in trajectories]
    batch = collate(trajectories, tokenizer.pad_token_id)
    assert batch.num_policy_tokens == sum(len(t.turns) for t in trajectories)  # one token per move


def test_expert_answers_must_fit_the_template() -> None:
    assert template_content("<move>B2</move>", "<move>{}</move>") == "B2"
    with pytest.raises(ValueError, match="does not fit the action template"):
        template_content("<move>B2</move>", "<cell>{}</cell>")


def test_oracles_that_read_the_env_are_experts_too(setting) -> None:
    # The SQL oracle reads each episode's gold query from its env: per-episode agents keep the episodes apart.
    _, _, tokenizer, _ = setting
    env_id = "rl-llm/TextToSQL-v0"
    trajectories = expert_trajectories(functools.partial(gym.make, env_id, mode="single"), tokenizer, env_id,
                                       "oracle", list(range(6)), None, concurrency=6)  # fmt: skip
    for trajectory in trajectories:
        assert trajectory.total_reward == 1.0 and trajectory.num_policy_tokens > 0
        (turn,) = trajectory.turns
        assert tokenizer.decode(trajectory.token_ids[turn.token_start : turn.token_end]) == turn.action


def test_sft_lowers_expert_nll_and_raises_legal_moves_on_held_out_seeds(setting) -> None:
    config, path, tokenizer, make_env = setting
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(path))
    expert = expert_trajectories(
        make_env, tokenizer, TTT, "minimax", list(range(1000, 1096)), config.env.action_template
    )
    train, held_out = (
        collate(expert[:80], tokenizer.pad_token_id),
        collate(expert[80:], tokenizer.pad_token_id),
    )

    def legal_share() -> float:
        # Greedy play on held-out game seeds: the share of the model's turns that were legal moves.
        tokens = config.rollout.max_new_tokens
        policy = HFPolicy(model, tokenizer, sampling=SamplingParams(tokens, 1.0), seed=0)
        try:
            result = evaluate_llm(make_env, policy, list(range(200_000, 200_016)), 0.0, tokens, 16)
        finally:
            policy.close()
        moves, illegal = sum(result.values["moves"]), sum(result.values["illegal_moves"])
        return moves / (moves + illegal)

    nll_before, legal_before = expert_nll(model, held_out), legal_share()
    losses = sft(
        model, train, epochs=3, lr=3e-3, batch_size=16, micro_batch_size=16, max_grad_norm=1.0, seed=0
    )
    nll_after, legal_after = expert_nll(model, held_out), legal_share()
    assert losses[-1] < losses[0]
    assert nll_after < nll_before - 2.0, (
        nll_before,
        nll_after,
    )  # random init: ~ln(vocab) = 7.6 nats per token
    assert legal_after > legal_before + 0.1, (legal_before, legal_after)  # measured: 0.0 -> 0.18


def test_exported_expert_episodes_tokenise_exactly_as_the_expert_was_recorded(setting, tmp_path: Path) -> None:
    # expert episodes -> trajectories file -> `rl-llm export --format sft-jsonl` -> the warm start's reader:
    # the same tokens and roles the rollout engine recorded (what `sft.data` trains on).
    from rl_llm.export import export
    from rl_llm.trainers.sft import file_trajectories

    config, _, tokenizer, make_env = setting
    expert = expert_trajectories(make_env, tokenizer, TTT, "minimax", list(range(6)), config.env.action_template)
    source = tmp_path / "expert.trajectories.jsonl"
    source.write_text("".join(t.to_json() + "\n" for t in expert))
    sft_file = export(source, "sft-jsonl").out
    read = file_trajectories(sft_file, tokenizer, config.env.action_template)
    assert [t.token_ids for t in read] == [t.token_ids for t in expert]
    assert [t.token_roles for t in read] == [t.token_roles for t in expert]
    assert [[(turn.token_start, turn.token_end, turn.reward) for turn in t.turns] for t in read] == \
        [[(turn.token_start, turn.token_end, turn.reward) for turn in t.turns] for t in expert]  # fmt: skip
    # Answers written whole (an eval of the baseline, no template) are cut to the template's content;
    # an answer marked train: false stays in the context as ENV tokens.
    rows = [json.loads(line) for line in sft_file.read_text().splitlines()]
    for row in rows:
        for message in row["messages"]:
            if message["role"] == "assistant":
                message["content"] = f"<move>{message['content']}</move>"
    rows[0]["messages"][2]["train"] = False
    whole = tmp_path / "whole.sft.jsonl"
    whole.write_text("".join(json.dumps(row) + "\n" for row in rows))
    again = file_trajectories(whole, tokenizer, config.env.action_template)
    assert [t.token_ids for t in again] == [t.token_ids for t in expert]
    first = expert[0].turns[0]
    assert set(again[0].token_roles[first.token_start : first.token_end]) == {int(TokenRole.ENV)}
    assert again[1].token_roles == expert[1].token_roles


def test_sft_data_must_name_a_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"sft\.data: no such file"):
        load_config(CONFIG, [f"sft.data={tmp_path / 'missing.jsonl'}"])
    (tmp_path / "x.sft.jsonl").write_text("")
    config = load_config(CONFIG, ["sft.episodes=0", f"sft.data={tmp_path / 'x.sft.jsonl'}"])
    assert config.sft.enabled and not load_config(CONFIG, ["sft.episodes=0"]).sft.enabled


def test_rl_llm_train_warm_starts_from_an_exported_file(tmp_path: Path) -> None:
    """`rl-llm eval` of the bandit's random baseline, `rl-llm export`, then the default job warm-started from the
    file (`sft.data`) instead of playing the baseline itself."""
    env = cli_env(COLUMNS="200", HOME=str(Path.home()))

    def rl_llm(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "rl_llm.cli", *args], capture_output=True, text=True,
                              timeout=600, env=env)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout + done.stderr

    kwargs = ["-k", "num_arms=3", "-k", "horizon=4", "-k", "means=[0.2, 0.9, 0.5]", "-k", "reward_mode=strategic",
              "-k", "invalid_action_penalty=3.0"]  # the default job's env  # fmt: skip
    rl_llm("eval", "MultiArmedBandit", "--agent", "random", "--episodes", "40", "--out", str(tmp_path / "r.jsonl"),
           *kwargs)  # fmt: skip
    data = tmp_path / "r.sft.jsonl"
    rl_llm("export", str(tmp_path / "r.jsonl"), "--format", "sft-jsonl", "--out", str(data))
    run = tmp_path / "run"
    output = rl_llm("train", "steps=1", "eval.episodes=2", "eval.baselines=[]", "rollout.prompts_per_step=2",
                    "rollout.group_size=2", "sft.episodes=0", f"sft.data={data}", "sft.held_out_episodes=8",
                    "sft.epochs=3", "log.tensorboard=false", "log.plot=false", "--out", str(run))  # fmt: skip
    record = json.loads((run / "warm_start.json").read_text())
    assert record["data"] == str(data) and record["episodes"] == 32 and record["baseline"] is None
    # Each "<action>X</action>" answer was cut to the label the model writes: one token per turn, 4 turns.
    assert record["expert_policy_tokens"] == 32 * 4
    assert record["loss_last"] < record["loss_first"]
    assert record["heldout_expert_nll_after"] < record["heldout_expert_nll_before"]
    assert "after SFT" in output and (run / "model").is_dir()
