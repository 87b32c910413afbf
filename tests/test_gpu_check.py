"""The GPU check's arithmetic (benchmarks/gpu_check.py): update FLOPs, MFU, LoRA parameter counts, GPU peaks
and pytest's counts, against hand-computed values; what a phase stopped at its limit reports."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from tests.cli_env import cli_env
from tests.scripts import load_benchmark


@pytest.fixture(scope="module")
def gpu_check() -> ModuleType:
    return load_benchmark("gpu_check")


# Qwen2.5-0.5B's linears per layer (in, out): q, k, v, o, gate, up, down; 24 layers.
QWEN05_LINEARS = [(896, 896), (896, 128), (896, 128), (896, 896), (896, 4864), (896, 4864), (4864, 896)] * 24
N = 359_692_800  # the 0.5B-shaped model's parameters (tiny vocabulary, tied embedding)


def test_update_flops_count_each_pass(gpu_check: ModuleType) -> None:
    # Full fine-tuning: 6N per token; + 2N old log-probs + 2N reference = 10N; checkpointing recomputes 2N.
    flops = gpu_check.update_flops
    assert flops(100, 100, 3) == (1800, 1800)
    assert flops(100, 100, 3, old_logprob_pass=True, reference_pass=True, recompute=True) == (3000, 3600)
    # Two epochs: two training passes (and two recomputes), the no-grad passes once.
    assert flops(100, 100, 1, epochs=2, old_logprob_pass=True, recompute=True) == (1400, 1800)
    # LoRA, 10 trainable of 100: 4N + 2T per token.
    assert flops(100, 10, 3) == (1260, 1260)


def test_lora_count_matches_peft_on_qwen05_body(gpu_check: ModuleType) -> None:
    # peft reports 8,798,208 trainable parameters for Qwen2.5-0.5B with r=16 on all linear layers.
    assert gpu_check.lora_parameters(QWEN05_LINEARS, 16) == 8_798_208


def test_step_figures_give_mfu_of_the_update(gpu_check: ModuleType) -> None:
    record = {"step": 2, "time/rollout_s": 18.0, "time/update_s": 7.7, "time/step_s": 26.0,
              "episode/policy_tokens_total": 40_000.0, "throughput/policy_tokens_per_s": 2222.2,
              "episode/sequence_length_mean": 500.0, "episode/trained": 256.0, "memory/peak_gpu_gib": 30.5,
              "reward/mean": -0.4}  # fmt: skip
    lora_config = {"enabled": False, "r": 16}
    config = {"optim": {"epochs": 1, "minibatches": 2}, "loss": {"kl_coef": 0.001},
              "model": {"dtype": "bfloat16", "gradient_checkpointing": True, "lora": lora_config}}
    model = {"n_params": N, "lora_linears": QWEN05_LINEARS}
    row = gpu_check.step_figures(record, model, config, 989e12)
    # 128,000 tokens x 10N = 4.6041e14 FLOPs in 7.7 s on 989 TFLOP/s: 6.05%; + 2N recompute: 7.26%.
    assert row["trained_tokens"] == 128_000
    assert row["update_tflop"] == pytest.approx(460.406784, rel=1e-9)
    assert row["mfu"] == pytest.approx(0.060454, rel=1e-4)
    assert row["hfu"] == pytest.approx(0.072545, rel=1e-4)
    assert (row["rollout_s"], row["peak_gib"], row["policy_tok_s"]) == (18.0, 30.5, 2222.2)
    # LoRA: N + adapters forward and backward to the activations, adapters' weight gradients: 8N' + 2T.
    config["model"]["lora"]["enabled"] = True
    lora = gpu_check.step_figures(record, model, config, 989e12)
    with_adapters = N + 8_798_208
    assert lora["update_tflop"] == pytest.approx((8 * with_adapters + 2 * 8_798_208) * 128_000 / 1e12)
    # No MFU without a known peak, or when the update is not in bf16.
    assert gpu_check.step_figures(record, model, config, None)["mfu"] is None
    config["model"]["dtype"] = "float32"
    assert gpu_check.step_figures(record, model, config, 989e12)["mfu"] is None


def test_peak_flops_by_gpu_name(gpu_check: ModuleType) -> None:
    peak = gpu_check.peak_bf16_flops
    assert peak("NVIDIA H100 80GB HBM3") == peak("NVIDIA H200") == 989e12
    assert (peak("NVIDIA H100 PCIe"), peak("NVIDIA H100 NVL")) == (756e12, 835e12)
    assert peak("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak("Tesla T4") is None and peak(None) is None


def test_pytest_counts_from_the_summary_or_the_progress_marks(gpu_check: ModuleType) -> None:
    counts = gpu_check.pytest_counts
    log = "..F\nFAILED tests/x.py::t - boom\n1 failed, 2 passed, 3 skipped, 1 deselected in 4.0s\n"
    assert counts(log) == {"passed": 2, "failed": 1, "skipped": 3, "deselected": 1}
    assert counts("= 5 passed, 2 errors in 1.00s =") == {"passed": 5, "failed": 0, "skipped": 0, "error": 2}
    # Stopped mid-run: no summary line; the progress marks are counted and the result marked incomplete.
    assert counts("$ python -m pytest\n..s.F [ 40%]\n..") == {
        "passed": 5, "failed": 1, "skipped": 1, "error": 0, "incomplete": 1}  # fmt: skip


def test_rollout_figures_from_the_benchmark_output(gpu_check: ModuleType) -> None:
    text = """backend hf | model m on cuda (359.69M parameters, batch_invariant=False) | torch threads 16

round  engine tok/s  backend tok/s transformers tok/s  ratio  CPU-time ratio  batches mean batch mean prompt
    0          1900           2100               2000  0.950           0.990        2       64.0         239
    1          2100           2300               2000  1.050           1.010        2       64.0         241

engine / transformers generate throughput over 2 rounds: median 1.000 per wall-clock second (meets the 0.9 target), 1.000 per CPU second
"""
    assert gpu_check.rollout_figures(text) == {"ratio": 1.0, "engine_tok_s": 2000.0, "transformers_tok_s": 2000.0}
    assert gpu_check.rollout_figures("Traceback (most recent call last):") == {}


# A phase that is busy in one function, with an idle thread beside it, as the check's stacks request finds it.
BUSY_PHASE = """
import threading
from rl_llm.cli import dump_stacks_on_sigusr1
assert dump_stacks_on_sigusr1()
threading.Thread(target=threading.Event().wait, daemon=True).start()
def spinning_in_here():
    print("ready", flush=True)
    while True:
        sum(range(1000))
spinning_in_here()
"""


def test_a_stopped_phase_says_where_it_was(gpu_check: ModuleType, tmp_path: Path) -> None:
    log_path = tmp_path / "phase.log"
    with log_path.open("w") as log:
        process = subprocess.Popen([sys.executable, "-c", BUSY_PHASE], stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True, env=cli_env())  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while "ready" not in log_path.read_text() and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            assert process.poll() is None, log_path.read_text()
            gpu_check.dump_stacks(process, wait_s=1.0)
            assert process.poll() is None, "SIGUSR1 ended the process: no stack dump handler"
        finally:
            gpu_check.stop(process)
    summary = gpu_check.stack_summary(log_path.read_text().splitlines())
    assert summary and re.match(r"(Current thread|Thread) 0x", summary[0]), log_path.read_text()
    assert "in spinning_in_here" in summary[1], summary  # innermost frame first
    assert not any("threading.py" in line for line in summary), "the idle thread is left out"


# Phases that are past their limit when the check asks for their stacks: one ends on its own in that moment
# (modelled: it exits 0 on the request), one keeps running, one has no stack handler (SIGUSR1 ends it).
PAST_ITS_LIMIT = {
    "ends": "import signal, sys, time\nsignal.signal(signal.SIGUSR1, lambda *_: sys.exit(0))\ntime.sleep(600)",
    "keeps_running": "import signal, time\nsignal.signal(signal.SIGUSR1, signal.SIG_IGN)\ntime.sleep(600)",
    "no_handler": "import time\ntime.sleep(600)",
}


def test_a_phase_that_ends_as_its_stacks_are_asked_for_is_not_reported_as_stopped(
    gpu_check: ModuleType, tmp_path: Path
) -> None:
    import argparse
    import dataclasses

    args = argparse.Namespace(quick=True, tests="none", out=str(tmp_path / "out"), work=str(tmp_path / "work"),
                              budget=600)  # fmt: skip
    check = gpu_check.Check(args, cli_env())
    check.plan = dataclasses.replace(check.plan, limits=dict.fromkeys(PAST_ITS_LIMIT, 5.0))
    codes = {name: check.run(name, [sys.executable, "-c", code]) for name, code in PAST_ITS_LIMIT.items()}
    phases = check.phases
    assert codes["ends"] == 0 and phases["ends"].status == "ok", phases["ends"]
    assert "ended just past its limit of 5 s" in phases["ends"].note
    for name in ("keeps_running", "no_handler"):
        assert codes[name] is None and phases[name].status == "timeout", phases[name]
        assert phases[name].note == "stopped after 5 s"


def test_stack_summary_reads_the_last_dump_only(gpu_check: ModuleType) -> None:
    dump = [
        "Thread 0x00007f01 (most recent call first):",
        '  File "/usr/lib/python3.12/threading.py", line 355 in wait',
        '  File "/x/agents/rollout.py", line 10 in run',
        "",
        "Current thread 0x00007f02 (most recent call first):",
        *(f'  File "/x/trainers/update.py", line {n} in f{n}' for n in range(12)),
    ]  # fmt: skip
    older = ["Thread 0x00007f09 (most recent call first):", '  File "/x/old.py", line 1 in old']
    lines = ["step 1/3  reward 0.1", *older, "step 2/3  reward 0.2", *dump, "Terminated"]
    summary = gpu_check.stack_summary(lines, frames=3)
    assert summary == [dump[4], *dump[5:8]]
    assert gpu_check.stack_summary(["step 1/3", "Traceback (most recent call last):"]) == []
