"""Config loading: YAML, dotted overrides, clear errors for unknown keys and bad types."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_llm.trainers.config import ConfigError, TrainConfig, config_to_dict, load_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_yaml_then_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, "algorithm: drgrpo\noptim:\n  lr: 1e-6\nenv:\n  id: rl-llm/TicTacToe-v0\n  kwargs: {opponent: random}\n")
    config = load_config(path, ["optim.lr=3e-5", "env.kwargs.max_illegal_moves=1", "model.lora.enabled=true",
                                "rollout.pods_keep=4", "eval.baselines=[random, minimax]"])  # fmt: skip
    assert config.algorithm == "drgrpo"
    assert config.optim.lr == pytest.approx(3e-5) and isinstance(config.optim.lr, float)
    assert config.env.kwargs == {"opponent": "random", "max_illegal_moves": 1}
    assert config.model.lora.enabled is True
    assert config.rollout.pods_keep == 4
    assert config.eval.baselines == ["random", "minimax"]


def test_round_trip_through_a_dict() -> None:
    config = load_config(overrides=["steps=7", "loss.kl_coef=0.001"])
    assert load_config(base=config_to_dict(config)) == config
    assert TrainConfig().validate() == load_config()


def test_unknown_keys_are_named_with_a_suggestion(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown config key optim\.'lrr' \(did you mean optim\.'lr'\?\)"):
        load_config(overrides=["optim.lrr=1"])
    with pytest.raises(ConfigError, match="unknown config key 'nonsense'"):
        load_config(write(tmp_path, "nonsense: 1\n"))


def test_bad_types_and_values_are_named() -> None:
    with pytest.raises(ConfigError, match=r"optim\.lr: expected float, got str 'fast'"):
        load_config(overrides=["optim.lr=fast"])
    with pytest.raises(ConfigError, match=r"steps: expected int, got float 2\.5"):
        load_config(overrides=["steps=2.5"])
    with pytest.raises(ConfigError, match=r"model\.lora\.enabled: expected bool"):
        load_config(overrides=["model.lora.enabled=maybe"])
    with pytest.raises(ConfigError, match=r"algorithm: 'sft' is not one of"):
        load_config(overrides=["algorithm=sft"])
    with pytest.raises(ConfigError, match=r"rollout\.group_size must be positive"):
        load_config(overrides=["rollout.group_size=0"])
    # The generator's settings are checked by the door that picks the generator (trainers/generation.py).
    with pytest.raises(ConfigError, match=r"rollout\.backend: 'sglang' is not one of \['hf', 'vllm'\]"):
        load_config(overrides=["rollout.backend=sglang"])
    with pytest.raises(ConfigError, match=r"rollout\.vllm\.mode: 'remote' is not one of \['colocate', 'server'\]"):
        load_config(overrides=["rollout.vllm.mode=remote"])
    with pytest.raises(ConfigError, match=r"rollout\.vllm\.max_restarts must be an integer >= 0 .*got -1"):
        load_config(overrides=["rollout.vllm.max_restarts=-1"])
    assert load_config(overrides=["rollout.vllm.max_restarts=0"]).rollout.vllm.max_restarts == 0  # 0: never restart
    with pytest.raises(ConfigError, match="is not a section"):
        load_config(overrides=["steps=3", "steps.x=1"])
    with pytest.raises(ConfigError, match="key=value"):
        load_config(overrides=["steps"])


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="mapping at the top level"):
        load_config(write(tmp_path, "- a\n- b\n"))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "a: [\n"))


def test_bad_files_are_named_on_one_line(tmp_path: Path) -> None:
    # PyYAML's message spans lines and calls the file "<unicode string>"; a non-UTF-8 file named no file at all.
    path = write(tmp_path, "steps: 3\noptim: [\n")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert str(error.value).startswith(f"config file {path} is not valid YAML: line 3, column 1: ")
    assert "\n" not in str(error.value) and "<unicode string>" not in str(error.value)
    with pytest.raises(ConfigError) as error:
        load_config(overrides=["optim.betas=[0.9"])
    assert "\n" not in str(error.value) and "line 1, column" in str(error.value)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\x00\xff\xfe")
    with pytest.raises(ConfigError, match=f"cannot read config file {binary}: 'utf-8' codec"):
        load_config(binary)


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml")), ids=str)
def test_shipped_configs_load_and_their_envs_build(path: Path) -> None:
    import gymnasium as gym

    import rl_llm  # noqa: F401

    config = load_config(path)
    if config.game is not None:  # a two-player game (social/<game>): its PettingZoo parallel env
        from rl_llm.envs.social import load

        env = load(config.game).parallel_env(**config.env.kwargs)
        observations, infos = env.reset(seed=0)
        observation, info = observations["player_0"], infos["player_0"]
    else:
        env = gym.make(config.env.id, **config.env.kwargs)
        observation, info = env.reset(seed=0)
    assert observation and info["task_id"]
    env.close()


def test_aggregation_follows_the_algorithm_unless_given() -> None:
    assert load_config(overrides=["algorithm=drgrpo"]).loss.aggregation == "seq_sum_constant"
    assert load_config(overrides=["algorithm=grpo"]).loss.aggregation == "seq_mean_token_mean"
    assert load_config(overrides=["algorithm=drgrpo", "loss.aggregation=token_mean"]).loss.aggregation == "token_mean"
