"""rl-llm envs through skyrl-gym's own registry, ``make`` and ``init`` / ``step`` API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.extras import import_extra

skyrl_gym = import_extra("skyrl_gym", "skyrl", "skyrl-gym: pip install 'rl-llm[skyrl]'")  # fails where CI installed it

from omegaconf import DictConfig  # noqa: E402
from skyrl_gym.envs.base_text_env import BaseTextEnv  # noqa: E402

from rl_llm.envs.registration import env_ids  # noqa: E402
from rl_llm.integrations.skyrl import make_skyrl_dataset, register_skyrl_envs  # noqa: E402


def test_every_env_is_registered_with_skyrl_gym() -> None:
    ids = register_skyrl_envs()
    assert set(env_ids()) <= set(ids) and "social/prisoners_dilemma_v0" in ids
    assert all(env_id in skyrl_gym.registry for env_id in ids)
    assert register_skyrl_envs() == ids  # idempotent


def test_tictactoe_episode_through_skyrl_make_and_step() -> None:
    register_skyrl_envs()
    rows = make_skyrl_dataset("rl-llm/TicTacToe-v0", seeds=[4, 5], opponent="minimax")
    assert [row["env_class"] for row in rows] == ["rl-llm/TicTacToe-v0"] * 2
    assert json.loads(rows[0]["extra_info"]["rl_llm_task"]) == {"seed": 4, "options": {}}
    # The way SkyRL's generator builds an env: env_config from its config (an OmegaConf node), extras from the row.
    env = skyrl_gym.make(
        "rl-llm/TicTacToe-v0",
        env_config=DictConfig({"opponent": "minimax"}),
        extras={**rows[0], "max_turns": 9},
    )
    assert isinstance(env, BaseTextEnv)
    chat, info = env.init(rows[0]["prompt"])
    assert chat == rows[0]["prompt"] and [m["role"] for m in chat] == ["system", "user"]
    assert info["task_id"]
    rewards, out = [], None
    for move in ("A1", "A2", "A3", "B1", "B2", "B3", "C1", "C2", "C3"):
        out = env.step(f"<move>{move}</move>")
        rewards.append(out["reward"])
        assert out["reward"] == pytest.approx(sum(out["metadata"]["reward_components"].values()))
        if out["done"]:
            break
        assert [m["role"] for m in out["observations"]] == ["user"]
    assert out["done"] and out["observations"] == []
    metrics = env.get_metrics()
    assert metrics["return"] == pytest.approx(sum(rewards)) and metrics["turns"] == len(rewards)
    assert BaseTextEnv.aggregate_metrics([metrics, metrics])["return"] == pytest.approx(sum(rewards))
    env.close()


def test_same_seed_same_episode_and_bad_action_is_an_invalid_turn() -> None:
    register_skyrl_envs()
    rows = make_skyrl_dataset("rl-llm/MultiArmedBandit-v0", seeds=[7])
    first = skyrl_gym.make("rl-llm/MultiArmedBandit-v0", env_config={}, extras=rows[0])
    second = skyrl_gym.make("rl-llm/MultiArmedBandit-v0", env_config=None, extras=rows[0])
    assert first.init([])[0] == second.init([])[0] == rows[0]["prompt"]
    out = first.step("no arm here")
    assert out["metadata"]["invalid_action"] and not out["done"]
    first.close()
    second.close()


def test_social_seat_against_a_baseline() -> None:
    register_skyrl_envs()
    env = skyrl_gym.make("social/prisoners_dilemma_v0", env_config={"opponent": "always_defect"}, extras={})
    chat, _ = env.init([])
    assert "<A>" in chat[-1]["content"]
    out = env.step("<A>")  # cooperating against a defector: the sucker's payoff
    cooperate = out["reward"]
    out = env.step("<B>")
    assert out["reward"] > cooperate
    env.close()


def test_unknown_env_or_kwargs_fail_clearly() -> None:
    register_skyrl_envs()
    with pytest.raises(ValueError, match="TicTacToe-v0 takes no option 'no_such_kwarg'; its options are"):
        skyrl_gym.make("rl-llm/TicTacToe-v0", env_config={"no_such_kwarg": 1}, extras={})
    from rl_llm.integrations.skyrl import RLLMSkyRLEnv

    with pytest.raises(ValueError, match="env id"):
        RLLMSkyRLEnv(env_config={}, extras={})


def test_dataset_rows_survive_parquet_as_skyrl_reads_them(tmp_path: Path) -> None:
    """SkyRL's trainer reads its dataset from parquet: the rows must write (an empty ``options`` dict used to be
    an empty struct, which parquet refuses) and come back to the same episodes; a dict task still works."""
    datasets = pytest.importorskip("datasets", reason="needs datasets (SkyRL reads its parquet with it)")
    register_skyrl_envs()
    rows = make_skyrl_dataset("rl-llm/MultiArmedBandit-v0", seeds=[3, 4])
    path = tmp_path / "train.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    back = list(datasets.load_dataset("parquet", data_files=str(path), split="train"))
    for row, original in zip(back, rows, strict=True):
        # SkyRL's env_extras: the row's fields other than the prompt and env class
        extras = {key: value for key, value in row.items() if key not in ("prompt", "env_class")}
        env = skyrl_gym.make(row["env_class"], env_config={}, extras=extras)
        assert env.init(row["prompt"])[0] == original["prompt"]
        env.close()
    as_dict = {"extra_info": {"rl_llm_task": {"seed": 3, "options": {}}}}
    env = skyrl_gym.make("rl-llm/MultiArmedBandit-v0", env_config={}, extras=as_dict)
    assert env.init([])[0] == rows[0]["prompt"]
    env.close()


@pytest.mark.parametrize(("seeds", "options", "message"), [
    ([1, float("nan")], None, r"^seeds\[1\] must be an integer, got nan$"),  # int(nan): "cannot convert float NaN"
    ([2.5], None, r"^seeds\[0\] must be an integer, got 2.5$"),  # int(2.5) quietly played seed 2
    ([-1], None, r"^seeds\[0\] must be an integer >= 0, got -1$"),
    ([0], ["opponent"], r"^options must be a dict, got list"),  # dict(["opponent"]): "update sequence element #0"
])  # fmt: skip
def test_dataset_rows_refuse_a_bad_seed_or_options_in_the_other_adapters_words(seeds, options, message) -> None:
    with pytest.raises(ValueError, match=message):
        make_skyrl_dataset("rl-llm/MultiArmedBandit-v0", seeds=seeds, options=options)
