"""Pieces of benchmarks/sample_efficiency.py and benchmarks/gigpo_anchors.py, against hand-computed values."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.scripts import BENCHMARKS, load_benchmark
from tests.trainers.test_turn_credit import episode


def test_the_summary_is_rebuilt_from_a_stopped_runs_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(BENCHMARKS))  # the script imports its sibling default_job
    try:
        bench = load_benchmark("sample_efficiency")
    finally:
        sys.path.remove(str(BENCHMARKS))
    log = tmp_path / "out.log"
    log.write_text(
        "         arm seed win SFT win RL   gain zero-signal episodes dropped level  wall s  cpu s  load\n"
        "        grpo    0   0.270  0.620 +0.350       0.200     3840       0     -   805.6  400.0   3.1\n"
        "Loading weights: 100%|##########| 26/26\n"
        " grpo+filter    0   0.270  0.570 +0.300       0.000     2736      24     -   697.2  300.0   3.2\n"
        "        grpo    1   0.330  0.650 +0.320       0.100     3840       0     -   832.8  600.0   3.6\n"
        " grpo+filter    1   0.330  0.610 +0.280       0.000     2904      50     -   743.0  500.0   3.7\n"
        "  curriculum    0   0.290  0.300 +0.010       0.092     3840       0     2   897.4  563.6   4.0\n"
        "        grpo    2   0.330  0.950 +0.620       0.100     3840       0     -   832.8  600.0   3.6\n"
    )
    rows = bench.rows_from_log(str(log))
    assert set(rows) == {"a", "b"} and len(rows["a"]) == 5 and rows["b"][0]["level"] == 2
    assert rows["a"][1] == {"arm": "grpo+filter", "seed": 0, "win_before": 0.27, "win_after": 0.57, "gain": 0.3,
                            "zero_signal": 0.0, "episodes": 2736, "dropped": 24, "wall_s": 697.2, "cpu_s": 300.0}
    bench.summarise("a", rows["a"])
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.strip()}
    # Seed 2 has no filter run yet: left out of both arms. grpo: gain (0.35 + 0.32) / 2 = 0.335; the filter arm 0.29, i.e. -0.045 against it; episodes 2820 / 3840.
    assert "+0.335" in lines["grpo"] and "0.150" in lines["grpo"] and "500 (1.00)" in lines["grpo"]
    assert "+0.290" in lines["grpo+filter"] and "-0.045" in lines["grpo+filter"]
    assert "2820 (0.73)" in lines["grpo+filter"] and "400 (0.80)" in lines["grpo+filter"]
    assert "gigpo" not in lines  # no run of it yet: left out, not a division by zero
    bench.summarise("b", rows["b"])  # the baseline arm (fixed@0.5) has no row: said so
    assert "no run of the baseline arm fixed@0.5 yet" in capsys.readouterr().out


def test_turn_sharing_counts_shared_anchors_and_nonzero_step_advantages() -> None:
    anchors = load_benchmark("gigpo_anchors")
    # Group 0: three episodes from one prompt; two reach observation "x" (returns differ), one reaches "y".
    # Group 1: one episode alone (its first turn shares nothing: no other member).
    group = [episode("t", "p", [("x", 0.0), ("end", 1.0)]), episode("t", "p", [("x", 0.0), ("end", 0.0)]),
             episode("t", "p", [("y", 0.0), ("end", 0.0)]), episode("u", "q", [("end", 1.0)])]  # fmt: skip
    stats = anchors.turn_sharing(group, [0, 0, 0, 1], gamma=1.0, anchor="observation")
    first, second = stats[0], stats[1]
    assert first["turns"] == 4 and first["shared"] == pytest.approx(3 / 4) and first["group_size"] == 3
    # First turns of group 0: returns 1, 0, 0 against their mean 1/3: all three nonzero; group 1's is 0.
    assert first["nonzero"] == pytest.approx(3 / 4)
    assert second["turns"] == 3 and second["shared"] == pytest.approx(2 / 3) and second["group_size"] == 2
    assert second["nonzero"] == pytest.approx(2 / 3)  # the two "x" turns: returns 1 and 0
