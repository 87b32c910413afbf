"""Two-player games on every generator (docs/multi-agent.md#backends-and-asynchronous-training): the vLLM
backends, colocated and server (vLLM's CPU build here, any build elsewhere), and asynchronous training with the
hf generator and with a vLLM server.

The vLLM tests skip where vLLM cannot be imported; the hf ones always run. A colocated engine of the tiny model
starts in a few seconds on 2 cores, a server in about 40 (two server runs here, one of them restarting its
server once): about 4 minutes for the file on a shared 2-core CPU.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from rl_llm.agents.vllm_backend import vllm_import_error
from rl_llm.trainers.cli import train_main
from rl_llm.trainers.logging import read_metrics

VLLM_MISSING = vllm_import_error()
needs_vllm = pytest.mark.skipif(VLLM_MISSING is not None, reason=f"needs vLLM (CPU or GPU build): {VLLM_MISSING}")

GAME = ["env.id=social/prisoners_dilemma_v0", "env.kwargs={num_rounds: 3, max_retries: 0}", "env.action_template=<{}>",
        "model.path=tiny", "model.dtype=float32", "algorithm=rloo", "rollout.group_size=2",
        "rollout.prompts_per_step=2", "rollout.max_new_tokens=1", "social.advantage_alignment=true",
        "social.opponents={self_play: 1.0, always_defect: 1.0}", "eval.episodes=1", "eval.baselines=[always_defect]",
        "sft.episodes=0", "optim.lr=1e-3", "log.samples=16", "log.tensorboard=false", "log.progress=false",
        "log.plot=false", "log.checkpoint_every=1"]  # fmt: skip
VLLM = ["rollout.backend=vllm", "rollout.vllm.max_model_len=1024"]
SERVER = [*GAME, *VLLM, "rollout.vllm.mode=server", "rollout.vllm.server_args=[--kv-cache-memory-bytes, '268435456']"]
TOLERANCE = 1e-4  # float32 on both sides: vLLM's kernels and transformers' agree to ~1e-6 on the tiny model
SEQUENCE = [3, 17, 250, 9, 41, 77, 5, 120, 33, 64, 8, 199, 21, 90, 14, 60]
# Figures that measure time, not learning (and the asynchronous loop's own, which a synchronous run lacks): the
# only ones left out when two runs are compared.
NOT_COMPARED = ("time/", "throughput/", "async/")


def samples(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]


def learners(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The learner's seats (a baseline's or a league member's seat names its opponent "policy")."""
    return [record for record in records if record["opponent"] != "policy"]


def assert_whole_matches(records: list[dict[str, Any]]) -> None:
    """Every sampled match holds both seats (samples.jsonl keeps whole matches: trainers/social.py)."""
    seats: dict[tuple, list[str]] = {}
    for record in records:
        seats.setdefault((record["step"], record["seed"], record["group_index"]), []).append(record["seat"])
    assert seats and all(sorted(pair) == ["player_0", "player_1"] for pair in seats.values()), seats


def assert_game_summary(run_dir: Path, steps: int) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == steps and summary["game"]["exploiter"] == "always_defect"
    for when in ("before", "after"):
        assert {"return", "exploitability", "return/always_defect", "welfare/self_play"} <= summary[when].keys()


# -- vLLM -----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    from rl_llm.agents import tiny_model
    from rl_llm.agents.llm import SamplingParams
    from rl_llm.agents.vllm_backend import VLLMPolicy

    policy = VLLMPolicy(tiny_model(), async_engine=False, dtype="float32", max_model_len=256, seed=0, seeded_draws=True,
                        sampling=SamplingParams(max_new_tokens=6, temperature=1.0),
                        kv_cache_memory_bytes=64 * 2**20)  # fmt: skip
    try:
        yield policy
    finally:
        policy.close()


@needs_vllm
def test_vllm_draws_follow_the_request_names_not_the_batch(engine: Any) -> None:
    """The engine names each draw (seed, group index, turn, seat); vLLM samples it from a seed of its own, so a
    seed group's games are the same however their requests are batched."""
    from rl_llm.agents.llm import GenerationRequest

    def request(seed: int, seat: str) -> GenerationRequest:
        return GenerationRequest(messages=[], prompt_ids=list(SEQUENCE), max_new_tokens=6,
                                 metadata={"seed": seed, "group_index": 0, "turn": 0, "seat": seat})  # fmt: skip

    names = [(seed, seat) for seed in range(3) for seat in ("player_0", "player_1")]
    batched = [c.token_ids for c in engine.generate([request(*name) for name in names])]
    reversed_batch = [c.token_ids for c in engine.generate([request(*name) for name in reversed(names)])][::-1]
    alone = [engine.generate([request(*name)])[0].token_ids for name in names]
    assert batched == reversed_batch == alone
    assert len({tuple(tokens) for tokens in batched}) > 1  # each named draw its own stream


def generator_logprobs(policy: Any) -> torch.Tensor:
    """The colocated engine's log-prob of each token of SEQUENCE after the first (temperature 1)."""
    import vllm

    params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
    (output,) = policy.llm.generate([vllm.TokensPrompt(prompt_token_ids=SEQUENCE)], params, use_tqdm=False)
    return torch.tensor([step[token].logprob for step, token in zip(output.prompt_logprobs[1:], SEQUENCE[1:], strict=True)])


@torch.no_grad()
def trainer_logprobs(model: torch.nn.Module) -> torch.Tensor:
    logits = model(torch.tensor([SEQUENCE], device=model.device)).logits[0, :-1].float().cpu()
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(SEQUENCE[1:])[:, None])[:, 0]


@needs_vllm
def test_a_colocated_vllm_game_step_trains_both_seats_and_syncs_the_engine(tmp_path: Path, monkeypatch) -> None:
    from rl_llm.trainers.config import load_config
    from rl_llm.trainers.grpo import score_and_update
    from rl_llm.trainers.runner import StepTimer, TrainingRun
    from rl_llm.types import TokenRole

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # what the runner sets; undone after the test
    threads = torch.get_num_threads()  # an in-process engine lowers this process's torch threads for serving
    # reinforce: every return is an advantage, so the update moves the weights
    # env seeds 2 and 3: one self-play group, one against always_defect (the opponent draw is a function of seeds)
    config = load_config(None, [*GAME, *VLLM, "algorithm=reinforce", "steps=2", "env.train_seed=2"])
    run = TrainingRun(config, tmp_path)
    try:
        trajectories = run.collect()
        matches = run.matches
        assert len(matches) == 4 and {m.opponent for m in matches} == {"self_play", "always_defect"}
        for match in matches:
            assert [t.seat for t in match.seats] == ["player_0", "player_1"]
            assert all(len(t.turns) == 3 and t.error is None for t in match.seats)  # num_rounds: 3
            assert match.learner == ((0, 1) if match.opponent == "self_play" else (match.seats[0].seed % 2,))
        assert len(trajectories) == sum(len(m.learner) for m in matches)
        for trajectory in trajectories:  # the policy's own tokens, with the engine's log-probs
            assert trajectory.num_policy_tokens == 3 and trajectory.policy_version == 0
            policy_logprobs = [lp for lp, role in zip(trajectory.logprobs, trajectory.token_roles, strict=True)
                               if role == TokenRole.POLICY]  # fmt: skip
            assert len(policy_logprobs) == 3 and all(lp < 0 for lp in policy_logprobs)
        before = generator_logprobs(run.generator)
        assert torch.allclose(before, trainer_logprobs(run.model), atol=TOLERANCE), "the engine starts from the model"
        _, stats = score_and_update(run, trajectories, StepTimer())
        assert stats["grad_norm"] > 0
        assert run.sync.push(run.model) == 1
        run.sync.before_rollout()
        after = generator_logprobs(run.generator)
        assert torch.allclose(after, trainer_logprobs(run.model), atol=TOLERANCE)
        assert (after - before).abs().max() > 100 * TOLERANCE  # the update reached the engine
        fresh = run.collect()
        assert fresh and {t.policy_version for t in fresh} == {1}  # the learner's seats, from the new weights
    finally:
        run.close()
        torch.set_num_threads(threads)


@needs_vllm
def test_a_colocated_vllm_game_run_with_a_baseline_and_a_league(tmp_path: Path, monkeypatch) -> None:
    """The CLI end to end on the colocated engine: self-play, a baseline and a league member (played through HF
    with the vLLM policy's sampling settings), the evaluation through the engine, the summary's game figures."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    threads = torch.get_num_threads()
    try:
        overrides = [*GAME, *VLLM, "steps=2", "rollout.prompts_per_step=3", "social.league_size=2",
                     "social.opponents={self_play: 1.0, always_defect: 1.0, league: 1.0}"]  # fmt: skip
        assert train_main(None, overrides, out=str(tmp_path)) == 0
    finally:
        torch.set_num_threads(threads)
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["policy_version"] for r in records] == [1, 2]
    assert all(0 < r["game/league_frac"] < 1 and 0 < r["game/self_play_frac"] < 1 for r in records)
    played = samples(tmp_path)
    assert_whole_matches(played)
    assert {"league:step-0", "always_defect", "self"} <= {r["opponent"] for r in played}
    assert all(r["policy_version"] == r["step"] - 1 for r in learners(played))
    assert_game_summary(tmp_path, 2)


@needs_vllm
def test_a_server_mode_game_run_trains_asynchronously(tmp_path: Path) -> None:
    """A vLLM server started by the run plays the matches of the coming step while the trainer updates
    (max_staleness 1); weights reach it over the process group after each step."""
    overrides = [*SERVER, "rollout.max_staleness=1", "loss.tis_cap=2", "steps=2"]
    assert train_main(None, overrides, out=str(tmp_path)) == 0
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["policy_version"] for r in records] == [1, 2]
    assert all(r["async/staleness_max"] <= 1 and r["async/dropped_stale"] == 0 for r in records)
    played = samples(tmp_path)
    assert_whole_matches(played)
    assert all(r["step"] - 2 <= turn["info"]["policy_version"] <= r["step"] - 1 for r in learners(played)
               for turn in r["turns"])  # fmt: skip
    assert (tmp_path / "vllm-server.log").exists()
    assert_game_summary(tmp_path, 2)


@needs_vllm
def test_a_server_lost_mid_step_is_restarted_and_the_steps_matches_are_played_again_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/vllm.md#when-the-server-dies for a game: the server the run started is SIGKILLed as step 2's matches
    start; the run restarts it with the trainer's weights and plays the step's matches again, both seats. Killed
    again as the final evaluation starts, it is restarted and the evaluation's matches are played again."""
    import os
    import signal

    import rl_llm.trainers.social as social
    from rl_llm.trainers.runner import TrainingRun

    play_matches, evaluate_game, killed = TrainingRun.play_matches, social.evaluate_game, []
    runs: list[TrainingRun] = []

    def kill(run: TrainingRun) -> None:
        process = run.generator.server.process
        killed.append(process.pid)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=60)

    def kill_then_play(run: TrainingRun, seeds: list[int]) -> Any:
        runs.append(run)
        if run.step == 1 and not killed:  # step 2's first rollout: every request of it fails
            kill(run)
        return play_matches(run, seeds)

    def kill_then_evaluate(*args: Any, **kwargs: Any) -> Any:  # after the evaluation's health check
        if runs and runs[0].step == 2 and len(killed) == 1:
            kill(runs[0])
        return evaluate_game(*args, **kwargs)

    monkeypatch.setattr(TrainingRun, "play_matches", kill_then_play)
    monkeypatch.setattr(social, "evaluate_game", kill_then_evaluate)
    overrides = [*SERVER, "steps=2"]
    assert train_main(None, overrides, out=str(tmp_path)) == 0
    assert len(killed) == 2
    # The final evaluation's lost matches were played again after a second restart: whole, not zeros.
    assert (tmp_path / "vllm-server.log").read_text().count("rl-llm: restarting the vLLM server") == 2
    after = json.loads((tmp_path / "eval_after.json").read_text())["values"]
    assert all(value == value for value in after["cooperation_rate/always_defect"]), after
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["vllm/restarts"] for r in records] == [0, 1] and [r["policy_version"] for r in records] == [1, 2]
    assert [r["episode/dropped"] for r in records] == [0, 0]
    assert all(r["episode/trained"] == 4 + 4 * r["game/self_play_frac"] for r in records)
    played = samples(tmp_path)
    assert len([r for r in played if r["step"] == 2]) == 4 * 2  # every match of step 2, both seats, no error
    assert_whole_matches(played)
    assert all(r["error"] is None and r["end_reason"] == "terminated" for r in played)


# -- asynchronous training with the hf generator --------------------------------------------------------------
def test_an_asynchronous_game_run_keeps_matches_whole_and_within_the_staleness_bound(tmp_path: Path) -> None:
    assert train_main(None, [*GAME, "steps=3", "rollout.max_staleness=1"], out=str(tmp_path)) == 0
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["policy_version"] for r in records] == [1, 2, 3]
    assert all(r["async/staleness_max"] <= 1 and r["async/groups"] == 2 for r in records)
    # both seats of a self-play match are trained on, the learner's alone against a baseline (4 matches a step)
    assert all(r["episode/trained"] == 4 + 4 * r["game/self_play_frac"] for r in records)
    played = samples(tmp_path)
    assert len(played) == 3 * 4 * 2  # every match of every step, both seats
    assert_whole_matches(played)
    # Each turn records the weights that produced it (what the staleness accounting reads: async_grpo.py): at most
    # one version behind its step. (The trajectory's own field is the version when the match started, which an
    # hf generator may still be about to replace by the snapshot waiting for its next generation call.)
    for record in learners(played):
        assert all(record["step"] - 2 <= turn["info"]["policy_version"] <= record["step"] - 1
                   for turn in record["turns"]), record  # fmt: skip
    assert_game_summary(tmp_path, 3)


def test_a_zero_staleness_game_run_repeats_the_synchronous_one_and_resumes_exactly(tmp_path: Path) -> None:
    """N=0 is the synchronous schedule: the same matches and updates; stopped after step 2 and resumed, it logs
    the same step 3 as the synchronous run that never stopped."""
    assert train_main(None, [*GAME, "steps=3"], out=str(tmp_path / "sync")) == 0
    asynchronous = [*GAME, "rollout.max_staleness=0"]
    assert train_main(None, [*asynchronous, "steps=2"], out=str(tmp_path / "async")) == 0
    assert train_main(None, [*asynchronous, "steps=3"], out=str(tmp_path / "async")) == 0
    sync, resumed = (read_metrics(tmp_path / run / "metrics.jsonl") for run in ("sync", "async"))
    assert [r["step"] for r in resumed] == [1, 2, 3] and all(r["async/staleness_max"] == 0 for r in resumed)
    for a, b in zip(sync, resumed, strict=True):
        a, b = ({k: v for k, v in r.items() if not k.startswith(NOT_COMPARED)} for r in (a, b))
        assert a == b
