"""The league of past policies (docs/multi-agent.md#the-league): the config, members saved every K steps and
evicted beyond league_size, a league seat playing the member's own weights, and training with it (metrics,
samples, files on disk, an exact resume)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from rl_llm.trainers.cli import train_main
from rl_llm.trainers.config import ConfigError, load_config
from rl_llm.trainers.league import League
from rl_llm.trainers.logging import read_metrics
from tests.trainers.test_social_training import QUICK

IPD = ["env.id=social/prisoners_dilemma_v0", "algorithm=rloo", "eval.baselines=[always_defect]"]


@pytest.fixture(scope="module")
def tiny_model_dir() -> Path:
    from rl_llm.agents.tiny import tiny_model

    return tiny_model()


# -- configuration --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["social.opponents={self_play: 1, league: 1}"], r"social\.opponents: league is named but social\.league_size is 0"),
        (["social.league_size=3"], r"social\.league_size: 3 past policies would be kept but never played"),
        (["social.opponents={league: 1}", "social.league_size=3", "social.league_every=0"], r"social\.league_every"),
        (["social.opponents={league: 1}", "social.league_size=-1"], r"social\.league_size must be an integer >= 0"),
        (["social.opponents={league: 0}", "social.league_size=2"], r"social\.opponents\.league"),
        # NaN passed "weight <= 0" and failed after start-up as numpy's "Probabilities contain NaN"
        (["social.opponents={self_play: .nan, always_defect: 1}"], r"social\.opponents\.self_play: the weight must be"),
        (["social.opponents={self_play: .inf}"], r"social\.opponents\.self_play: the weight must be a positive number"),
    ],
)
def test_a_league_that_would_not_play_is_refused_in_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        load_config(None, [*IPD, *overrides])
    assert "\n" not in str(error.value)


def test_a_league_config_loads() -> None:
    config = load_config(None, [*IPD, "social.opponents={self_play: 1, league: 2, always_defect: 1}",
                                "social.league_size=30", "social.league_every=5"])  # fmt: skip
    assert config.social.league_size == 30 and config.social.league_every == 5
    assert config.social.opponents["league"] == 2


# -- members on disk ------------------------------------------------------------------------------------------
def _members_on_disk(root: Path) -> list[int]:
    return sorted(int(re.match(r"step-(\d+)\.pt", p.name).group(1)) for p in root.glob("step-*.pt"))


def test_members_join_every_k_steps_and_the_oldest_leave(tmp_path: Path) -> None:
    model = nn.Linear(3, 2)
    league = League(tmp_path / "league", size=2, every=2)
    saved = {}
    for step in range(7):
        with torch.no_grad():
            model.weight.fill_(float(step))
        league.update(step, model)
        saved[step] = copy.deepcopy(league.state_dict())
    assert league.members == [4, 6]  # 0, 2, 4, 6 joined; 0 and 2 left
    member = torch.load(league.path(6), weights_only=True)
    assert set(member) == {"weight", "bias"} and torch.all(member["weight"] == 6.0)
    # A checkpoint taken at step 3 listed [0, 2]: until a newer checkpoint prunes, a resume from it finds them.
    assert _members_on_disk(tmp_path / "league") == [0, 2, 4, 6]
    resumed = League(tmp_path / "league", size=2, every=2)
    resumed.load_state_dict(saved[3])
    assert resumed.members == [0, 2]
    league.prune()
    assert _members_on_disk(tmp_path / "league") == [4, 6]
    with pytest.raises(FileNotFoundError, match="league members are missing"):
        resumed.load_state_dict(saved[3])


def test_under_lora_a_member_is_the_adapter_alone(tmp_path: Path, tiny_model_dir: Path) -> None:
    from rl_llm.trainers.config import LoraConfig, ModelConfig
    from rl_llm.trainers.modeling import load_causal_lm

    model = load_causal_lm(tiny_model_dir, ModelConfig(lora=LoraConfig(enabled=True, r=2)), torch.device("cpu"))
    league = League(tmp_path / "league", size=30, every=1)
    league.update(0, model)
    member = torch.load(league.path(0), weights_only=True)
    assert member and all("lora_" in name for name in member)
    assert sum(t.numel() for t in member.values()) < sum(p.numel() for p in model.parameters()) / 5


# -- a league seat plays the member ---------------------------------------------------------------------------
@pytest.mark.parametrize("lora", [False, True])
def test_a_league_seat_plays_the_members_weights(tmp_path: Path, tiny_model_dir: Path, lora: bool) -> None:
    """The league seat's moves are those of a policy built from the member's weights directly, in the same
    seat of the same matches, and not those of the current policy."""
    from rl_llm.agents.baselines.social import SOCIAL_BASELINES
    from rl_llm.agents.hf import HFPolicy
    from rl_llm.agents.llm import SamplingParams
    from rl_llm.agents.rollout import collect_games
    from rl_llm.trainers.config import LoraConfig, ModelConfig
    from rl_llm.trainers.modeling import is_peft, load_causal_lm

    def load() -> nn.Module:
        config = ModelConfig(lora=LoraConfig(enabled=lora, r=4))
        return load_causal_lm(tiny_model_dir, config, torch.device("cpu"))

    def policy(model: nn.Module) -> HFPolicy:
        module = model.get_base_model() if is_peft(model) else model
        return HFPolicy(module, tokenizer, sampling=SamplingParams(max_new_tokens=3, temperature=1.0), seed=11)

    current = load()
    member = load()
    with torch.no_grad():  # the member: other weights than the current policy (the trainable ones)
        generator = torch.Generator().manual_seed(0)
        for parameter in member.parameters():
            if parameter.requires_grad:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.5)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    league = League(tmp_path / "league", size=4, every=1)
    league.update(3, member)
    generator_policy = policy(current)
    direct = policy(member)
    opponent = SOCIAL_BASELINES["prisoners_dilemma_v0"]["always_defect"](seed=0)
    seeds, kwargs = [0, 1, 2, 3], {"num_rounds": 3, "max_retries": 0}

    def second_seat(engine_policy: HFPolicy, player: object) -> list[list[str]]:
        matches = collect_games("prisoners_dilemma_v0", engine_policy, seeds, 2, env_kwargs=kwargs,
                                players=lambda seed, g: (opponent, player))  # fmt: skip
        assert all(t.error is None for match in matches for t in match)
        return [[turn.action for turn in match[1].turns] for match in matches]

    seat = league.player(3, current, generator_policy)
    played = second_seat(generator_policy, seat)
    matches = collect_games("prisoners_dilemma_v0", generator_policy, seeds[:1], 1, env_kwargs=kwargs,
                            players=lambda seed, g: (opponent, seat))  # fmt: skip
    assert matches[0][0].opponent == "league:step-3"
    assert played == second_seat(direct, None)  # the member's own moves, token for token
    assert played != second_seat(generator_policy, None)  # not the current policy's
    for policy_ in (generator_policy, direct, seat):
        policy_.close()


# -- training -------------------------------------------------------------------------------------------------
LEAGUE = [*QUICK, "sft.episodes=0", "eval.episodes=1", "social.opponents={self_play: 1.0, league: 3.0}",
          "social.league_size=2", "social.league_every=1", "log.samples=8"]  # fmt: skip


def test_a_league_run_logs_its_members_and_resumes_exactly(tmp_path: Path) -> None:
    assert train_main(None, [*LEAGUE, "steps=3"], out=str(tmp_path / "straight")) == 0
    assert train_main(None, [*LEAGUE, "steps=2"], out=str(tmp_path / "resumed")) == 0
    assert train_main(None, [*LEAGUE, "steps=3"], out=str(tmp_path / "resumed")) == 0
    straight = read_metrics(tmp_path / "straight" / "metrics.jsonl")
    # Members 0, 1, 2 join before steps 1, 2, 3; with league_size 2 the third evicts step 0.
    assert [r["game/league_size"] for r in straight] == [1.0, 2.0, 2.0]
    assert any(r["game/league_frac"] > 0 for r in straight)
    assert _members_on_disk(tmp_path / "straight" / "league") == [1, 2]
    state = json.loads((tmp_path / "straight" / "checkpoints" / "step_000003" / "state.json").read_text())
    assert state["league"] == {"members": [1, 2]}
    samples = [json.loads(line) for line in (tmp_path / "straight" / "samples.jsonl").read_text().splitlines()]
    members = {1: {0}, 2: {0, 1}, 3: {1, 2}}
    played = [(s["step"], s["opponent"]) for s in samples if s["opponent"].startswith("league:")]
    assert played and all(int(name.removeprefix("league:step-")) in members[step] for step, name in played)
    resumed = read_metrics(tmp_path / "resumed" / "metrics.jsonl")[-1]
    for name in ("game/welfare", "game/return_player_0", "game/league_frac", "game/league_size", "reward/mean",
                 "loss/policy_loss", "loss/grad_norm"):  # fmt: skip
        assert resumed[name] == straight[-1][name], name
