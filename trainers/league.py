"""The league of past policies: opponent ``league`` of a two-player game run (docs/multi-agent.md#the-league).

- **Members** are the trainable weights of the policy at steps 0, K, 2K, ... (``social.league_every``: K), as
  checkpoints keep them (``trainable_state``: the LoRA adapter alone under LoRA, the full state dict
  otherwise), one ``torch.save`` file each under ``RUN_DIR/league/step-000004.pt``. A member is added when
  the next step's rollout starts (the weights after step ``s`` are the member ``step-s``), so step 0's
  policy, the warm-started one, is there from step 1 on. Beyond ``social.league_size`` members the oldest
  leaves the league.
- **Resume**: the member list is part of each checkpoint (``state_dict``). A file is deleted only once a
  checkpoint saved after its eviction is the latest one (``prune``), so the list of the checkpoint a run
  resumes from always finds its files; a file of a member added after that checkpoint is written again,
  with the same weights, when the resumed run reaches its step.
- **Playing**: one frozen copy of the trainer's module holds one member at a time (``load_state_dict`` of the
  member's tensors, the LoRA adapter's only under LoRA); ``LeaguePolicy`` generates with it and seeds every
  draw by (policy seed, env seed, group index, turn, seat) as the rollout engine does for the policy's own
  seats, so a resumed run replays the same moves.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rl_llm.agents.hf import HFPolicy
from rl_llm.agents.llm import GenerationRequest, LLMEpisode
from rl_llm.agents.policy import Completion, EpisodeStart
from rl_llm.paths import atomic_path
from rl_llm.trainers.modeling import is_peft, trainable_state
from rl_llm.trainers.social import member_label
from rl_llm.types import Message

_MEMBER = re.compile(r"^step-(\d+)\.pt$")


class League:
    """The member list (steps, oldest first), its files, and the frozen copy that plays a member."""

    def __init__(self, root: str | Path, size: int, every: int) -> None:
        if size < 1 or every < 1:
            raise ValueError(f"a league needs size >= 1 and every >= 1, got {size} and {every}")
        self.root = Path(root)
        self.size = size
        self.every = every
        self.members: list[int] = []
        self._player: LeaguePolicy | None = None
        self._frozen: nn.Module | None = None
        self._loaded: int | None = None

    def path(self, step: int) -> Path:
        return self.root / f"step-{step:06d}.pt"

    # -- membership -----------------------------------------------------------------------------------------
    def update(self, step: int, model: nn.Module) -> None:
        """Add the policy's current weights as member ``step`` when ``step`` is a multiple of ``every``."""
        if step % self.every or step in self.members:
            return
        state = {name: tensor.detach().to("cpu", copy=True) for name, tensor in trainable_state(model).items()}
        with atomic_path(self.path(step)) as partial:
            torch.save(state, partial)
        self.members.append(step)
        del self.members[: -self.size]  # the oldest leave; their files stay until prune (module docstring)
        if self._loaded == step:  # a member re-added after a resume: its weights may be newer than the copy's
            self._loaded = None

    def draw(self, rng: Any) -> int:
        """A member, uniformly, from ``rng`` (a ``numpy`` generator: the opponent stream of a seed group)."""
        if not self.members:
            raise RuntimeError("the league has no member yet (members are added when a step's rollout starts)")
        return self.members[int(rng.integers(len(self.members)))]

    def state_dict(self) -> dict[str, Any]:
        return {"members": list(self.members)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        members = [int(step) for step in state.get("members", [])]
        missing = [str(self.path(step)) for step in members if not self.path(step).exists()]
        if missing:
            raise FileNotFoundError(f"the checkpoint's league members are missing on disk: {missing[:3]}")
        self.members = members
        self._loaded = None

    def prune(self) -> None:
        """Delete the files of members no longer in the league (call once a checkpoint holds the list)."""
        for path in self.root.glob("step-*.pt"):
            match = _MEMBER.match(path.name)
            if match is not None and int(match.group(1)) not in self.members:
                path.unlink(missing_ok=True)

    # -- playing a member -----------------------------------------------------------------------------------
    def player(self, step: int, model: nn.Module, generator: Any, autocast_dtype: torch.dtype | None = None,
               max_batch_size: int = 32, seed: int | None = None) -> LeaguePolicy:  # fmt: skip
        """The policy that plays member ``step``: one frozen copy of ``model`` (the trainer's module, built on
        first use), the member's tensors copied in when the member changes. Its sampling follows
        ``generator``'s (settings, seed, autocast), so it draws as the policy itself would. A vLLM generator
        lends only its sampling settings (its draws are seeded by ``seed``, the run's, whether or not vLLM's
        are): the member plays through HF on the trainer's device, under
        ``autocast_dtype`` (the trainer's) and in batches of ``max_batch_size``
        (docs/multi-agent.md#backends-and-asynchronous-training)."""
        if step not in self.members:
            raise KeyError(f"step {step} is not a member of the league {self.members}")
        if self._frozen is None:
            self._frozen = copy.deepcopy(model).eval()
            for parameter in self._frozen.parameters():
                parameter.grad = None  # nothing trains the copy; the trainer's gradients are not needed here
        if self._loaded != step:
            state = torch.load(self.path(step), map_location="cpu", weights_only=True)
            _, unexpected = self._frozen.load_state_dict(state, strict=not is_peft(self._frozen))
            if unexpected:
                raise RuntimeError(f"league member {self.path(step)} does not fit the model: {unexpected[:5]}")
            self._loaded = step
        if self._player is None:
            module = self._frozen.get_base_model() if is_peft(self._frozen) else self._frozen
            self._player = LeaguePolicy(module, generator.tokenizer, sampling=generator.sampling,
                                        max_batch_size=getattr(generator, "max_batch_size", max_batch_size),
                                        seed=generator.seed if seed is None else seed,
                                        batch_invariant=getattr(generator, "batch_invariant", None),
                                        autocast_dtype=getattr(generator, "autocast_dtype", autocast_dtype))  # fmt: skip
        self._player.sampling = generator.sampling
        self._player.name = member_label(step)
        return self._player


class LeaguePolicy(HFPolicy):
    """A past policy in one seat of a game. The rollout engine plays it through ``start_episode`` (it is not
    the engine's policy); each request names its draw as the engine names the policy's own (agents/rollout.py
    ``_act``), so the seat samples what a policy with these weights would sample there."""

    def start_episode(self, episode: EpisodeStart) -> LLMEpisode:
        return _SeededEpisode(self, episode.stop or self.stop, episode)


class _SeededEpisode(LLMEpisode):
    """One seat of one match: token-in, token-out like the engine's record of the policy's own seats (the
    first prompt rendered once, then each completion's tokens and the template delta of each new user
    message), so the member conditions on exactly the tokens the policy would."""

    def __init__(self, policy: HFPolicy, stop: Sequence[str], episode: EpisodeStart) -> None:
        super().__init__(policy, stop)
        self.episode = episode
        self.token_ids: list[int] | None = None
        self.seen = 0  # messages of the conversation already in token_ids
        self.last: Completion | None = None

    def request(self, conversation: Sequence[Message]) -> GenerationRequest:
        chat = self.policy.chat_format
        news = list(conversation[self.seen :])
        if (self.token_ids is not None and self.last is not None and self.last.token_ids is not None
                and len(news) == 2 and news[0].role == "assistant" and news[1].role == "user"):  # fmt: skip
            self.token_ids += [*self.last.token_ids, *chat.observation_ids(news[1].content, self.last.token_ids)]
        else:  # the first turn (or a conversation the engine grew otherwise): render it whole
            self.token_ids = chat.prompt_ids(conversation)
        self.seen = len(conversation)
        turn = sum(message.role == "assistant" for message in conversation)  # the seat's turns so far
        metadata = {"seed": self.episode.seed, "group_index": self.episode.group_index, "turn": turn,
                    **({"seat": self.episode.seat} if self.episode.seat else {})}  # fmt: skip
        # As the engine's own seats: no more new tokens than the context has room for. A full context ends the
        # match as an error (the engine ends its own seats' episodes as context_limit instead).
        limit = getattr(self.policy.model.config, "max_position_embeddings", None) or 1 << 30
        budget = min(self.policy.sampling.max_new_tokens, limit - len(self.token_ids))
        if budget < 1:
            raise RuntimeError(f"the league seat's context is full ({len(self.token_ids)} of {limit} tokens)")
        return GenerationRequest(messages=list(conversation), prompt_ids=list(self.token_ids), stop=self.stop,
                                 max_new_tokens=budget, metadata=metadata)  # fmt: skip

    def act(self, conversation: Sequence[Message]) -> Completion:
        self.last = self.policy.generate([self.request(conversation)])[0]
        return self.last

    async def aact(self, conversation: Sequence[Message]) -> Completion:
        self.last = await self.policy.agenerate(self.request(conversation))
        return self.last
