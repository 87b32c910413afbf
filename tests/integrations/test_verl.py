"""The verl adapter: an rl-llm episode per sample inside verl's agent-loop API, on CPU.

verl's own pieces run for real (its ``RLHFDataset`` reading our parquet, its hydra-based agent-loop
instantiation, its incremental tokenisation); the one stand-in is the inference server (verl runs vLLM or
SGLang servers on GPUs): a small class with verl's ``generate(request_id, prompt_ids, sampling_params)``
signature backed by the real tiny transformers model.
"""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path
from typing import Any

import pytest

import rl_llm.integrations.verl as adapter
from rl_llm.integrations.generic import EnvFactory
from tests.extras import required_extras

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "verl"
TTT = "rl-llm/TicTacToe-v0"


def _verl_agent_loop() -> Any:
    try:
        return importlib.import_module("verl.experimental.agent_loop.agent_loop")
    except ImportError as error:  # pragma: no cover - depends on the machine
        if "verl" in required_extras():  # .ci/run installed it: a skip would hide a broken install
            raise
        pytest.skip(f"verl's agent loop API does not import here ({error}); pip install 'rl-llm[verl]' and "
                    "pip install --no-deps 'verl==0.9.1'")


def test_module_imports_without_touching_verl_and_reads_tasks() -> None:
    factory, task = adapter.episode_spec({"extra_info": {"rl_llm": adapter.task_json(TTT, 5, {"opponent": "minimax"})}})
    assert factory == EnvFactory(TTT, opponent="minimax") and task == {"seed": 5, "options": {}}
    factory, task = adapter.episode_spec({"extra_info": {}}, default_env_id=TTT, default_env_kwargs={"opponent": "random"})
    assert factory == EnvFactory(TTT, opponent="random") and task["seed"] is None
    with pytest.raises(ValueError, match="no env for this sample"):
        adapter.episode_spec({"extra_info": None})
    with pytest.raises(AttributeError):
        adapter.NoSuchThing  # noqa: B018


def test_agent_loop_class_is_registered_where_verl_looks_it_up() -> None:
    agent_loop = _verl_agent_loop()
    import hydra

    cls = adapter.RLLMAgentLoop
    assert issubclass(cls, agent_loop.AgentLoopBase)
    target = agent_loop._agent_loop_registry[adapter.AGENT_NAME]["_target_"]
    assert target == "rl_llm.integrations.verl.RLLMAgentLoop"
    assert hydra.utils.get_class(target) is cls


def _flatten(config: Any, prefix: str = "") -> set[str]:
    from omegaconf import DictConfig

    keys = set()
    for key in config:
        path = f"{prefix}{key}"
        keys.add(path)
        value = config._get_node(key) if isinstance(config, DictConfig) else None
        if isinstance(value, DictConfig):
            keys |= _flatten(value, path + ".")
    return keys


def test_config_examples_only_use_keys_verl_knows() -> None:
    agent_loop = _verl_agent_loop()
    from omegaconf import OmegaConf

    entries = OmegaConf.load(CONFIGS / "agent_loops.yaml")
    assert [entry.name for entry in entries] == [adapter.AGENT_NAME]
    assert entries[0]._target_ == "rl_llm.integrations.verl.RLLMAgentLoop"
    verl_config = OmegaConf.load(Path(agent_loop.__file__).parents[2] / "trainer" / "config" / "_generated_ppo_trainer.yaml")
    ours = OmegaConf.load(CONFIGS / "grpo_tictactoe.yaml")
    known = _flatten(verl_config)
    unknown = {key for key in _flatten(ours) if key.split(".")[0] not in ("hydra", "defaults") and key not in known}
    assert not unknown, f"keys verl's ppo_trainer config does not have: {sorted(unknown)}"
    assert ours.actor_rollout_ref.rollout.agent.default_agent_loop == adapter.AGENT_NAME


class TinyModelServer:
    """verl's ``server_manager.generate`` signature on the real tiny transformers model (CPU)."""

    def __init__(self) -> None:
        from rl_llm.agents.hf import HFPolicy
        from rl_llm.agents.llm import SamplingParams
        from rl_llm.agents.tiny import tiny_model

        self.policy = HFPolicy(tiny_model(), sampling=SamplingParams(temperature=1.0), seed=0)
        self.requests: list[dict[str, Any]] = []

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], priority: int = 0, **_: Any
    ) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        from rl_llm.agents.llm import GenerationRequest

        self.requests.append({"prompt_ids": list(prompt_ids), "request_id": request_id, "priority": priority, **sampling_params})
        request = GenerationRequest(
            messages=[], prompt_ids=list(prompt_ids), stop=tuple(sampling_params.get("stop", ())),
            max_new_tokens=sampling_params["max_tokens"],
        )  # fmt: skip
        completion = (await asyncio.get_running_loop().run_in_executor(None, self.policy.generate, [request]))[0]
        return TokenOutput(token_ids=completion.token_ids, log_probs=completion.logprobs)


def _run_episodes(rows_path: Path, response_length: int, max_new_tokens: int) -> tuple[list[Any], list[dict], TinyModelServer]:
    agent_loop = _verl_agent_loop()
    import hydra
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    server = TinyModelServer()
    config = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"prompt_length": 4096, "response_length": response_length}},
        "data": {"max_prompt_length": 4096, "filter_overlong_prompts": False, "filter_overlong_prompts_workers": 1},
    })  # fmt: skip
    dataset = RLHFDataset(str(rows_path), server.policy.tokenizer, config.data)
    samples = [dataset[i] for i in range(len(dataset))]
    entry = {**OmegaConf.to_container(OmegaConf.load(CONFIGS / "agent_loops.yaml"))[0], "max_new_tokens": max_new_tokens}

    async def play_all() -> list[Any]:
        outputs = []
        for index, sample in enumerate(samples):
            kwargs = {k: v for k, v in sample.items() if k != "dummy_tensor"} | {"priority": index}
            loop = hydra.utils.instantiate(  # exactly how verl's AgentLoopWorker builds an agent loop
                config=entry, trainer_config=agent_loop.DictConfigWrap(config), server_manager=server,
                tokenizer=server.policy.tokenizer, processor=None, hf_model_type=None, dataset_cls=RLHFDataset,
                data_config=agent_loop.DictConfigWrap(config.data), tools=agent_loop.ToolListWrap([]),
            )  # fmt: skip
            outputs.append(await loop.run({"temperature": 1.0, "top_p": 1.0, "logprobs": True}, **kwargs))
        return outputs

    return asyncio.run(play_all()), samples, server


def _policy_segments(output: Any) -> list[list[int]]:
    segments: list[list[int]] = []
    previous = 0
    for token, keep in zip(output.response_ids, output.response_mask, strict=True):
        if keep and not previous:
            segments.append([])
        if keep:
            segments[-1].append(token)
        previous = keep
    return segments


def test_agent_loop_plays_whole_episodes_from_a_verl_dataset(tmp_path: Path) -> None:
    _verl_agent_loop()
    rows = adapter.verl_rows(TTT, [3, 4], env_kwargs={"opponent": "minimax", "max_illegal_moves": 1})
    path = adapter.write_verl_dataset(tmp_path / "train.parquet", rows)
    outputs, samples, server = _run_episodes(path, response_length=4096, max_new_tokens=12)
    tokenizer = server.policy.tokenizer
    for output, sample in zip(outputs, samples, strict=True):
        env_factory, task = adapter.episode_spec(sample)
        env = env_factory()
        observation, info = env.reset(seed=task["seed"])
        opening = [{"role": "system", "content": info["system_prompt"]}, {"role": "user", "content": observation}]
        prompt_text = tokenizer.apply_chat_template(opening, add_generation_prompt=True, tokenize=False)
        assert output.prompt_ids == tokenizer.encode(prompt_text, add_special_tokens=False)
        # replay the policy's turns (the mask-1 token runs) on a fresh env: same per-turn rewards
        actions = [tokenizer.decode(segment, skip_special_tokens=True) for segment in _policy_segments(output)]
        rewards = []
        for action in actions:
            _, reward, terminated, truncated, _ = env.step(action)
            rewards.append(reward)
        assert terminated or truncated  # the episode was played to its end
        assert output.extra_fields["turn_scores"] == rewards
        assert output.reward_score == pytest.approx(sum(rewards))
        assert output.extra_fields["episode_done"] is True
        assert len(output.response_logprobs) == len(output.response_ids)
        assert any(not keep for keep in output.response_mask)  # env replies are in the response, masked
    # each turn honoured the per-turn budget and the env's stop strings
    assert all(r["max_tokens"] == 12 and r["stop"] == ["</move>"] for r in server.requests)
    # every turn of an episode shares its request id (verl routes it to one server) and carries its priority
    ids_by_priority = {r["priority"]: set() for r in server.requests}
    for r in server.requests:
        ids_by_priority[r["priority"]].add(r["request_id"])
    assert sorted(ids_by_priority) == [0, 1] and all(len(ids) == 1 for ids in ids_by_priority.values())
    assert ids_by_priority[0] != ids_by_priority[1]


def test_agent_loop_stops_at_the_response_length(tmp_path: Path) -> None:
    _verl_agent_loop()
    rows = adapter.verl_rows(TTT, [9], env_kwargs={"max_illegal_moves": 20})
    outputs, _, _ = _run_episodes(adapter.write_verl_dataset(tmp_path / "t.parquet", rows), response_length=160, max_new_tokens=16)
    output = outputs[0]
    assert len(output.response_ids) == len(output.response_mask) <= 160
    assert output.extra_fields["episode_done"] is False  # cut by the budget, reported as unfinished
    assert output.reward_score == pytest.approx(sum(output.extra_fields["turn_scores"]))


def test_an_env_error_ends_its_own_episode_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An env raising in step ends that sample's episode with what it played and says why; the other samples
    play on (raised out of ``run``, it would fail every sample verl's worker gathers with it)."""
    _verl_agent_loop()

    class FailingOnSeed3(adapter.MessageEnv):
        def reset(self, task: Any = None) -> Any:
            self.seed = task["seed"]
            return super().reset(task)

        def step(self, messages: Any) -> Any:
            if self.seed == 3 and getattr(self, "stepped", False):
                raise OSError("sandbox died")
            self.stepped = True
            return super().step(messages)

    monkeypatch.setattr(adapter, "MessageEnv", FailingOnSeed3)
    rows = adapter.verl_rows(TTT, [3, 4], env_kwargs={"max_illegal_moves": 20})
    outputs, _, _ = _run_episodes(adapter.write_verl_dataset(tmp_path / "t.parquet", rows), response_length=4096, max_new_tokens=12)
    failed, played = outputs
    assert failed.extra_fields["env_error"] == "OSError: sandbox died"
    assert failed.extra_fields["episode_done"] is False and len(failed.extra_fields["turn_scores"]) == 1
    assert len(failed.response_ids) == len(failed.response_mask) and failed.response_mask[-1] == 1
    assert failed.reward_score == pytest.approx(sum(failed.extra_fields["turn_scores"]))
    assert played.extra_fields["env_error"] is None and played.extra_fields["episode_done"] is True
