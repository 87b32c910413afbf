"""Bad input for two-player training (docs/multi-agent.md): unknown env ids get one line naming the known ids,
and options of the other kind of env are refused when the config loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_llm.trainers.cli import train_main
from rl_llm.trainers.config import ConfigError, load_config

IPD = ["env.id=social/prisoners_dilemma_v0", "algorithm=rloo", "eval.baselines=[always_defect]"]


@pytest.mark.parametrize("env_id", ["social/prisoners_dilema_v0", "rl-llm/NoSuchEnv-v0", "social"])
def test_an_unknown_env_id_names_the_known_ones(env_id: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(None, [f"env.id={env_id}"])
    message = str(error.value)
    assert "\n" not in message and env_id in message
    assert "social/prisoners_dilemma_v0" in message and "rl-llm/TicTacToe-v0" in message


def test_the_cli_answers_an_unknown_env_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert train_main(None, ["env.id=social/nope_v0", "steps=2"], out=str(tmp_path / "run")) == 2
    output = capsys.readouterr().out
    assert "Traceback" not in output and "unknown env 'social/nope_v0'" in output
    assert "social/tictactoe_v0" in output and not (tmp_path / "run").exists()


def test_env_options_the_env_does_not_take_are_one_line_at_load_time(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match=r"MultiArmedBandit-v0 takes no option 'bogus'; its options are num_arms"):
        load_config(None, ["env.id=rl-llm/MultiArmedBandit-v0", "env.kwargs.bogus=1"])
    with pytest.raises(ConfigError, match=r"social/prisoners_dilemma_v0 takes no option 'cell_names'; its options "
                                          r"are payoffs, num_rounds"):
        load_config(None, [*IPD, "env.kwargs.cell_names=numbers"])
    load_config(None, ["env.id=social/tictactoe_v0", "algorithm=rloo", "eval.baselines=[random]",
                       "sft.baseline=random", "env.kwargs.cell_names=numbers"])  # fmt: skip
    # The default job with only env.id changed keeps its bandit options: one line that says so, no run dir.
    assert train_main(None, ["env.id=rl-llm/TicTacToe-v0", "steps=1"], out=str(tmp_path / "run")) == 2
    output = capsys.readouterr().out
    assert "Traceback" not in output and "takes no option 'num_arms'" in output and "env.kwargs={}" in output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["algorithm=ppo"], "algorithm"),
        (["otc.enabled=true"], "otc.enabled"),
        (["rollout.pods_keep=2"], "rollout.pods_keep"),
        # a match paused mid-game would split its pair of seats (docs/multi-agent.md#backends-and-asynchronous-training)
        (["rollout.max_staleness=1", "rollout.partial_rollouts=true"], "rollout.partial_rollouts"),
        (["rollout.max_staleness=1", "social.league_size=2", "social.opponents={self_play: 1.0, league: 1.0}"],
         "social.opponents"),  # the league with asynchronous training
        (["social.league_size=4"], "social.league_size"),
        (["social.per_seat_policies=true"], "social.per_seat_policies"),
        (["algorithm=grpo"], "algorithm"),  # per-round credit is rloo or reinforce
        (["social.credit=outcome", "social.advantage_alignment=true"], "advantage_alignment"),
        (["social.opponents={self_play: 1.0, minimax: 1.0}"], "social.opponents"),
        (["social.opponents={always_defect: 0}"], "social.opponents.always_defect"),
        (["eval.baselines=[random, ucb]"], "eval.baselines"),
        (["social.learner_seat=alice"], "social.learner_seat"),
        (["social.gamma=1.5"], "social.gamma"),
        (["advantage.turn_level=true"], "advantage.turn_level"),
    ],
)
def test_single_agent_only_options_are_refused_on_a_game(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as error:
        load_config(None, [*IPD, *overrides])
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("overrides", [
    ["rollout.backend=vllm"],
    ["rollout.backend=vllm", "rollout.vllm.mode=server", "rollout.max_staleness=1"],
    ["rollout.max_staleness=0"],
    ["rollout.backend=vllm", "social.league_size=2", "social.opponents={self_play: 1.0, league: 1.0}"],
])  # fmt: skip
def test_games_train_on_vllm_and_asynchronously(overrides: list[str]) -> None:
    config = load_config(None, [*IPD, *overrides])  # accepted: docs/multi-agent.md#backends-and-asynchronous-training
    assert config.game == "prisoners_dilemma_v0"


@pytest.mark.parametrize("override", ["social.advantage_alignment=true", "social.opponents={always_defect: 1.0}",
                                      "social.beta=1.0"])
def test_game_options_are_refused_on_a_single_agent_env(override: str) -> None:
    with pytest.raises(ConfigError, match=r"social\..*two-player games"):
        load_config(None, ["env.id=rl-llm/TicTacToe-v0", override])


def test_a_game_config_with_the_papers_options_loads() -> None:
    config = load_config(None, [*IPD, "social.advantage_alignment=true",
                                "social.opponents={self_play: 3, tit_for_tat: 1}", "env.action_template=<{}>"])  # fmt: skip
    assert config.game == "prisoners_dilemma_v0" and config.social.opponents == {"self_play": 3, "tit_for_tat": 1}
    assert load_config(None, ["env.id=rl-llm/TicTacToe-v0"]).game is None


def test_gymnasiums_module_colon_id_form_is_accepted_and_checked() -> None:
    """``module:id`` (as ``gym.make`` takes it) imports the module, which registers the id, before the check."""
    assert load_config(None, ["env.id=tests.trainers.longtail_env:tests/LongTail-v0"]).env.id.endswith("LongTail-v0")
    with pytest.raises(ConfigError, match="cannot import 'no_such_module'"):
        load_config(None, ["env.id=no_such_module:X-v0"])
    with pytest.raises(ConfigError, match=r"unknown env 'tests\.trainers\.longtail_env:tests/Nope-v0'"):
        load_config(None, ["env.id=tests.trainers.longtail_env:tests/Nope-v0"])
