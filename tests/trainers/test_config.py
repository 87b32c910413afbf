"""Config loading: YAML, dotted overrides, clear errors for unknown keys and bad types."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_llm.trainers.config import (
    ConfigError,
    TrainConfig,
    check_overrides_unique,
    config_to_dict,
    load_config,
)


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
    # the whole dotted path quoted once (optim.'lrr' before)
    with pytest.raises(ConfigError, match=r"unknown config key 'optim\.lrr' \(did you mean 'optim\.lr'\?\)"):
        load_config(overrides=["optim.lrr=1"])
    with pytest.raises(ConfigError, match=r"unknown config key 'model\.lora\.rr' \(did you mean 'model\.lora\.r'\?\)"):
        load_config(write(tmp_path, "model:\n  lora: {rr: 4}\n"))
    with pytest.raises(ConfigError, match="unknown config key 'nonsense'"):
        load_config(write(tmp_path, "nonsense: 1\n"))


def test_a_key_repeated_in_the_file_is_refused_with_its_line(tmp_path: Path) -> None:
    """YAML keys are unique; PyYAML kept the last value silently (lr 1e-3 here, the 1e-6 above it unseen)."""
    path = write(tmp_path, "optim:\n  lr: 1e-6\n  eps: 1e-8\n  lr: 1e-3\n")
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert str(refused.value) == (f"config file {path} is not valid YAML: line 4, column 3: duplicate key "
                                  "'optim.lr' (first on line 2)")  # fmt: skip
    with pytest.raises(ConfigError, match=r"line 3, column 1: duplicate key 'steps' \(first on line 1\)"):
        load_config(write(tmp_path, "steps: 5\nseed: 1\nsteps: 7\n"))
    with pytest.raises(ConfigError, match=r"duplicate key 'env\.kwargs\.horizon'"):  # in a flow mapping too
        load_config(write(tmp_path, "env:\n  kwargs: {horizon: 5, horizon: 6}\n"))
    # The same name in two sections is no repeat, and a key merged in from an anchor may be overridden.
    config = load_config(write(tmp_path, "optim: {lr: 0.5}\nsft: {lr: 0.25}\nenv:\n  kwargs:\n"
                                         "    <<: {horizon: 5, num_arms: 3}\n    horizon: 6\n"))  # fmt: skip
    assert (config.optim.lr, config.sft.lr, config.env.kwargs) == (0.5, 0.25, {"horizon": 6, "num_arms": 3})


def test_a_key_given_twice_on_the_command_line_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """As Hydra refuses "Multiple values for optim.lr": the last value won silently before. (tests/test_cli.py
    runs `rl-llm train optim.lr=1 optim.lr=2` itself.)"""
    from rl_llm.trainers.cli import train_main

    with pytest.raises(ConfigError) as refused:
        check_overrides_unique(["optim.lr=1", "steps=3", " optim.lr =2"])
    assert str(refused.value) == "multiple values for 'optim.lr' ('optim.lr=1' and ' optim.lr =2'); give each key once"
    # `rl-llm train steps=3 steps=4`: the first positional is an override too
    assert train_main("steps=3", ["steps=4"], command_line=True) == 2
    assert "error: multiple values for 'steps' ('steps=3' and 'steps=4')" in capsys.readouterr().out
    # A section and a key inside it: the section's mapping replaced the whole section, so optim.lr=0.1 was lost.
    with pytest.raises(ConfigError, match=r"^'optim.lr=0.1' and 'optim=\{minibatches: 1\}' overlap \(a section and"):
        check_overrides_unique(["optim.lr=0.1", "optim={minibatches: 1}"])
    # Code may layer specifics over a base list: load_config applies overrides in order.
    assert load_config(overrides=["steps=3", "optim.lr=1", "steps=4"]).steps == 4
    with pytest.raises(ConfigError, match=r"override 'env\.kwargs=\{a: 1, a: 2\}': value is not valid YAML .*"
                                          r"duplicate key 'a'"):  # fmt: skip
        load_config(overrides=["env.kwargs={a: 1, a: 2}"])
    # A section, then a key inside it, is two different keys: applied in order.
    config = load_config(overrides=["env.kwargs={horizon: 5}", "env.kwargs.num_arms=3"])
    assert config.env.kwargs == {"horizon": 5, "num_arms": 3}


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


@pytest.mark.parametrize("override", ["optim.lr=.nan", "optim.lr=.inf", "rollout.temperature=.nan", "ppo.gamma=.nan",
                                      "loss.kl_coef=-.inf", "optim.lr='nan'", "optim.eps=1" + "0" * 400])  # fmt: skip
def test_nan_and_infinity_are_refused_for_every_number(override: str) -> None:
    """NaN passed every "<= 0" check: optim.lr=.nan trained, and the first update made every weight NaN."""
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"^{key}: expected a finite number, got "):
        load_config(overrides=[override])


@pytest.mark.parametrize(("override", "message"), [
    ("seed=-1", r"seed must be in \[0, 4294967295\], got -1"),  # the first env reset refused it, after the model was loaded
    ("eval.seed=-5", r"eval.seed must be in \[0, 4294967295\], got -5"),
    ("log.checkpoint_every=0", "log.checkpoint_every must be >= 1, got 0"),  # ZeroDivisionError after step 1
    ("log.keep_checkpoints=0", "log.keep_checkpoints must be >= 1, got 0"),
    ("optim.max_grad_norm=0", "optim.max_grad_norm must be > 0, got 0.0"),  # zeroed every gradient
    ("rollout.top_p=1.5", r"rollout.top_p must be in \(0, 1\], got 1.5"),
    ("rollout.top_p=0", r"rollout.top_p must be in \(0, 1\], got 0.0"),
    ("ppo.gamma=1.01", r"ppo.gamma must be in \[0, 1\], got 1.01"),
    ("ppo.lam_actor=-0.1", r"ppo.lam_actor must be in \[0, 1\], got -0.1"),
    ("model.lora.dropout=1", r"model.lora.dropout must be in \[0, 1\), got 1.0"),
    ("model.lora.r=0", "model.lora.r must be >= 1, got 0"),
    ("optim.weight_decay=-0.01", "optim.weight_decay must be >= 0, got -0.01"),
    ("loss.kl_coef=-1", "loss.kl_coef must be >= 0, got -1.0"),
    ("otc.c=0", "otc.c must be > 0, got 0.0"),
    ("rollout.vllm.gpu_memory_utilization=1.5", r"rollout.vllm.gpu_memory_utilization must be in \(0, 1\], got 1.5"),
    ("rollout.vllm.server_group_port=70000", r"rollout.vllm.server_group_port must be in \[0, 65535\], got 70000"),
    ("ppo.critic_lr=-1", "ppo.critic_lr must be > 0, got -1.0"),
    ("seed=4294967296", r"seed must be in \[0, 4294967295\], got 4294967296"),  # numpy's words after start-up
    ("loss.norm_constant=0", "loss.norm_constant must be >= 1, got 0.0"),  # fell back to max_new_tokens
    # each passed, and failed once the model had loaded and the server started (or never started)
    ("rollout.vllm.max_model_len=-5", "rollout.vllm.max_model_len must be >= 1, got -5"),
    ("rollout.vllm.server_url=notaurl", "rollout.vllm.server_url must be a server URL starting with http:// or "
                                        "https://, such as http://127.0.0.1:8000, got 'notaurl'"),
    ("rollout.vllm.server_gpus=abc", r"rollout.vllm.server_gpus must be CUDA_VISIBLE_DEVICES for the server \(GPU "
                                     r"indices or UUIDs, comma-separated, such as 1 or 2,3; empty: none\), got 'abc'"),
    ("loss.norm_constant=1e-300", "loss.norm_constant must be >= 1, got 1e-300"),  # NaN gradients every step
    ("optim.betas=[0.9]", r"optim.betas must be two numbers in \[0, 1\) \(Adam's\), got \[0.9\]"),  # IndexError
    ("optim.betas=[2, 3]", r"optim.betas must be two numbers in \[0, 1\) \(Adam's\), got \[2.0, 3.0\]"),
    ("eval.baselines=[ucbb]", r"eval.baselines: 'ucbb' is not a baseline of rl-llm/MultiArmedBandit-v0; choose from "
                              r"\['random', 'epsilon_greedy', 'ucb', 'thompson', 'oracle'\]"),  # skipped silently
])  # fmt: skip
def test_numbers_out_of_their_range_are_refused_naming_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{message}$"):
        load_config(overrides=[override])


def test_the_edges_of_each_range_and_null_offs_are_taken() -> None:
    config = load_config(overrides=["seed=0", "rollout.top_p=1", "ppo.gamma=0", "ppo.value_clip=null",
                                    "model.lora.dropout=0", "loss.entropy_coef=-0.01", "eval.temperature=0",
                                    "rollout.vllm.server_group_port=65535"])  # fmt: skip
    assert (config.rollout.top_p, config.ppo.value_clip, config.loss.entropy_coef) == (1.0, None, -0.01)


def test_a_section_given_as_a_mapping_merges_as_a_config_files_section_does() -> None:
    """``optim={minibatches: 1}`` over the default job dropped its lr and micro_batch_size (the section was
    replaced); a dict-valued setting (env.kwargs) is still replaced whole."""
    from rl_llm.trainers.default_job import DEFAULT_JOB

    config = load_config(overrides=["optim={minibatches: 1}", "env.kwargs={horizon: 3}"], base=DEFAULT_JOB)
    assert (config.optim.minibatches, config.optim.lr, config.optim.micro_batch_size) == (1, 0.005, 32)
    assert config.env.kwargs == {"horizon": 3}


def test_a_warm_start_baseline_the_env_lacks_is_refused_before_anything_loads() -> None:
    with pytest.raises(ConfigError, match=r"^sft.baseline: 'minimax' is not a baseline of rl-llm/MultiArmedBandit-v0"):
        load_config(overrides=["sft.episodes=4", "sft.baseline=minimax"])
    assert load_config(overrides=["sft.episodes=4", "sft.baseline=ucb"]).sft.baseline == "ucb"



def test_a_run_directory_whose_saved_config_is_no_yaml_is_named_in_one_line(tmp_path: Path) -> None:
    """PyYAML's own message (its position and a caret line) made the error five lines long."""
    from rl_llm.trainers.cli import check_run_dir

    (tmp_path / "checkpoints" / "step_2").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_2" / "state.json").write_text("{}")  # what marks a whole checkpoint
    (tmp_path / "config.yaml").write_text(": : :\n")
    with pytest.raises(ConfigError, match=r"holds a checkpoint but its config.yaml cannot be read \(line 1") as refused:
        check_run_dir(load_config(), tmp_path)
    assert "\n" not in str(refused.value)
