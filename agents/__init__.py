"""rl_llm.agents: policies (LLM backends and classical baselines), rollouts and evaluation.

- ``make_policy(spec, env_id, seed, **options)``: any agent from a command-line spec (see its docstring).
- LLM backends (``rl_llm.agents.llm``): ``HFPolicy`` (``rl_llm.agents.hf``), ``VLLMPolicy``
  (``rl_llm.agents.vllm_backend``), ``VLLMServerPolicy`` (``rl_llm.agents.vllm_server``),
  ``OpenAIPolicy`` (``rl_llm.agents.openai_backend``).
- ``Policy.start_episode(EpisodeStart(env, info, seed, ...)) -> EpisodeAgent`` (``rl_llm.agents.policy``): how
  every agent plays, one ``EpisodeAgent`` per episode holding that episode's state.
- ``collect(env, policy, seeds, group_size, ...)`` (``rl_llm.agents.rollout``): the one episode loop, for any
  agent, concurrent, recorded as ``Trajectory`` records (token-in, token-out for LLMs); the trainer's data
  source, and what ``evaluate`` (``rl_llm.agents.evaluate``), ``rl-llm bench`` and ``rl-llm play`` run.
- ``tiny_model(path=None)`` / ``default_tiny_model_path()`` (``rl_llm.agents.tiny``): a small random chat
  model built locally from a pinned, versioned recipe (``RECIPE_VERSION``), cached under
  ``~/.cache/rl-llm/tiny-qwen2-r<version>`` (``$RL_LLM_CACHE`` moves the cache).

Heavy dependencies (torch, transformers, vLLM) load only when an LLM backend is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rl_llm.agents.baselines import BASELINES, baselines_for, make_baseline
from rl_llm.agents.llm import GenerationRequest, LLMPolicy, SamplingParams
from rl_llm.agents.policy import Completion, EpisodeAgent, EpisodeStart, Policy, TextPolicy
from rl_llm.agents.rollout import collect, read_trajectories, write_trajectories
from rl_llm.agents.tiny import default_tiny_model_path, tiny_model
from rl_llm.checks import integer
from rl_llm.urls import is_http_url

LLM_BACKENDS = ("hf", "vllm", "vllm-serve", "openai")
SAMPLING_OPTIONS = ("max_new_tokens", "temperature", "top_p", "top_k")


def is_llm_spec(spec: str) -> bool:
    return spec.partition(":")[0] in LLM_BACKENDS and ":" in spec


def make_policy(spec: str, env_id: str, seed: int | None = None, **options: Any) -> Policy:
    """Build an agent from a spec.

    - ``NAME``: a baseline of ``env_id`` (``ucb``, ``minimax``, ...; ``rl-llm list`` shows them).
    - ``hf:tiny`` or ``hf:PATH``: transformers ``generate`` (the tiny local model, or a model directory).
    - ``vllm:MODEL``: vLLM in this process; ``vllm:http://HOST:PORT#MODEL``: a running vLLM server;
      ``vllm-serve:MODEL``: start ``vllm serve MODEL`` and use it.
    - ``openai:URL#MODEL``: an OpenAI-compatible chat completions endpoint (``$OPENAI_API_KEY``).

    ``options``: sampling settings (``max_new_tokens``, ``temperature``, ``top_p``, ``top_k``) and keyword
    arguments of the backend class (``device``, ``dtype``, ``timeout_s``, ...). ``None`` values are ignored.
    """
    if not isinstance(spec, str):
        raise ValueError(f"spec must be a str such as 'random' or 'hf:tiny', got {spec!r}")
    seed = None if seed is None else integer("seed", seed)
    options = {key: value for key, value in options.items() if value is not None}
    if not is_llm_spec(spec):
        if ":" in spec:
            raise ValueError(f"unknown agent backend in {spec!r}; use one of {', '.join(LLM_BACKENDS)} or a baseline")
        if options:
            raise ValueError(f"options {sorted(options)} apply to LLM agents, not to the baseline {spec!r}")
        return make_baseline(spec, env_id, seed=seed)
    backend, _, target = spec.partition(":")
    if not target:
        raise ValueError(f"{spec!r}: the {backend} backend needs a model ({backend}:MODEL)")
    sampling = SamplingParams(**{key: options.pop(key) for key in SAMPLING_OPTIONS if key in options})
    if backend == "hf":
        from rl_llm.agents.hf import HFPolicy

        if target.startswith(("/", "./", "../", "~")) and not Path(target).expanduser().is_dir():
            # a path, not a Hub id: transformers would answer "Repo id must use alphanumeric chars"
            raise FileNotFoundError(f"{spec!r}: no model directory {target}")

        return HFPolicy(target, sampling=sampling, seed=seed, **options)
    if backend == "openai":
        from rl_llm.agents.openai_backend import OpenAIPolicy

        url, model = _url_and_model(spec, target)
        return OpenAIPolicy(url, model, sampling=sampling, **options)
    from rl_llm.agents.vllm_server import VLLMServerPolicy

    if backend == "vllm-serve":
        return VLLMServerPolicy.launch(target, sampling=sampling, **options)
    if is_http_url(target):
        url, model = _url_and_model(spec, target)
        return VLLMServerPolicy(url, model, sampling=sampling, **options)
    from rl_llm.agents.vllm_backend import VLLMPolicy

    return VLLMPolicy(target, sampling=sampling, seed=seed or 0, **options)


def _url_and_model(spec: str, target: str) -> tuple[str, str]:
    url, sep, model = target.partition("#")
    if not sep or not model or not is_http_url(url):
        raise ValueError(f"{spec!r}: expected URL#MODEL, e.g. openai:https://api.openai.com/v1#gpt-4o-mini")
    return url, model


__all__ = [
    "BASELINES",
    "Completion",
    "EpisodeAgent",
    "EpisodeStart",
    "GenerationRequest",
    "LLMPolicy",
    "Policy",
    "SamplingParams",
    "TextPolicy",
    "baselines_for",
    "collect",
    "default_tiny_model_path",
    "is_llm_spec",
    "make_baseline",
    "make_policy",
    "read_trajectories",
    "tiny_model",
    "write_trajectories",
]
