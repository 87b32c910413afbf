"""One training step with the vllm backend (engine colocated in this process) and its weight sync: after
the sync, the generator's log-probs on fresh rollouts match the trainer's updated model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rl_llm.agents.vllm_backend import vllm_import_error

pytestmark = pytest.mark.skipif(
    vllm_import_error() is not None or not torch.cuda.is_available(),
    reason=f"needs vLLM and a CUDA GPU ({vllm_import_error() or 'no CUDA device'})",
)


def test_generator_logprobs_match_the_trainer_after_a_synced_step(tmp_path: Path) -> None:
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process: load_weights in place
    from rl_llm.trainers.advantages import broadcast, grpo
    from rl_llm.trainers.config import load_config
    from rl_llm.trainers.modeling import token_logprobs
    from rl_llm.trainers.runner import TrainingRun
    from rl_llm.trainers.update import policy_update

    config = load_config(overrides=[
        "rollout.backend=vllm", "rollout.vllm.gpu_memory_utilization=0.2", "rollout.max_new_tokens=8",
        "rollout.prompts_per_step=2", "rollout.group_size=4", "optim.lr=1e-3", "log.tensorboard=false",
        "env.kwargs={num_arms: 3, horizon: 2}",
    ])  # fmt: skip
    run = TrainingRun(config, tmp_path)
    try:
        batch = run.score(run.collect())
        advantages = broadcast(grpo(batch.scores, batch.group_ids) + 1.0, batch.policy_mask)
        policy_update(run.model, run.optimizer, batch, advantages, config, run.shuffle)
        assert run.sync.push(run.model) == 1
        fresh = run.score(run.collect())
        assert fresh.policy_versions.tolist() == [1] * len(fresh)
        with torch.no_grad():
            ours, _ = token_logprobs(run.model, fresh.input_ids, fresh.attention_mask,
                                     config.rollout.temperature, positions=fresh.policy_mask)  # fmt: skip
        mask = fresh.policy_mask
        assert torch.allclose(ours[mask], fresh.old_logprobs[mask], atol=2e-3)
    finally:
        run.close()
