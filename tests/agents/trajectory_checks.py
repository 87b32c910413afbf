"""Checks shared by the backend tests: token bookkeeping of a trajectory and its log-probs against a forward pass."""

from __future__ import annotations

import torch

from rl_llm.agents.llm import LLMPolicy
from rl_llm.types import TokenRole, Trajectory


def assert_token_bookkeeping(trajectory: Trajectory, policy: LLMPolicy) -> None:
    """Every token once, with a role; each turn's policy tokens decode to exactly the text the env received."""
    ids, roles, logprobs = trajectory.token_ids, trajectory.token_roles, trajectory.logprobs
    assert len(ids) == len(roles) == len(logprobs)
    assert roles[0] == TokenRole.PROMPT
    policy_positions = {i for i, role in enumerate(roles) if role == TokenRole.POLICY}
    in_turns: set[int] = set()
    for turn in trajectory.turns:
        span = range(turn.token_start, turn.token_end)
        assert all(roles[i] == TokenRole.POLICY for i in span)
        assert policy.decode(ids[turn.token_start : turn.token_end]) == turn.action
        in_turns.update(span)
    assert in_turns == policy_positions, "every policy token belongs to exactly one turn"
    assert all(logprobs[i] == 0.0 for i in range(len(ids)) if i not in policy_positions)
    assert all(logprobs[i] <= 0.0 for i in policy_positions)
    # The recorded context is what the chat template gives for these messages, turn by turn.
    assert policy.chat_format.prompt_ids(trajectory.messages[:2]) == ids[: trajectory.turns[0].token_start]
    for turn, following, message in zip(trajectory.turns, trajectory.turns[1:], trajectory.messages[3::2]):
        assert message.role == "user" and message.content == turn.observation
        env_tokens = ids[turn.token_end : following.token_start]
        assert all(roles[i] == TokenRole.ENV for i in range(turn.token_end, following.token_start))
        assert turn.observation in policy.tokenizer.decode(env_tokens)


def assert_logprobs_match_forward_pass(trajectory: Trajectory, model: torch.nn.Module, tolerance: float = 1e-4) -> float:
    """Recompute log_softmax(logits / T) of every policy token with one forward pass; return the largest gap."""
    positions = [i for i, role in enumerate(trajectory.token_roles) if role == TokenRole.POLICY]
    assert positions and positions[0] > 0
    with torch.no_grad():
        logits = model(torch.tensor([trajectory.token_ids])).logits[0].float()
    logprobs = torch.log_softmax(logits / trajectory.temperature, dim=-1)
    index = torch.tensor(positions)
    fresh = logprobs[index - 1].gather(1, torch.tensor(trajectory.token_ids)[index][:, None]).squeeze(1)
    recorded = torch.tensor([trajectory.logprobs[i] for i in positions])
    gap = float((fresh - recorded).abs().max())
    assert gap < tolerance, f"log-probs differ from a fresh forward pass by {gap:.2e}"
    return gap
