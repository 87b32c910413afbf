"""Sandbox latency and throughput, each measured against bare `subprocess.run` in the same run.

    python benchmarks/sandbox.py            # full run
    python benchmarks/sandbox.py --quick    # fewer repetitions

Rows: bare subprocess.run, bwrap cold (`Sandbox.run`: a fresh bwrap per command), a warm pooled session
(`pool.acquire()` -> `sb.session().run`), and docker (cold and session) where an engine answers. Workloads:
`echo hi` and a 10-line Python script. Then commands per second with 2 and 8 sandboxes running concurrently.
Targets from issue 3: warm session p50 within 2x of bare subprocess; cold bwrap p50 under 20 ms.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from functools import partial

from rl_llm.sandboxes import SandboxPool, backend_problem, make

PYTHON_SCRIPT = """\
import json, math
values = [math.sqrt(i) for i in range(1000)]
total = sum(values)
squares = {i: i * i for i in range(100)}
text = json.dumps(squares)
decoded = json.loads(text)
assert len(decoded) == 100
primes = [n for n in range(2, 200) if all(n % d for d in range(2, int(n ** 0.5) + 1))]
print(round(total, 3), len(primes))
print("ok")
"""
PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "python3"  # the interpreter sandboxes use


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return statistics.median(ordered), p99


def measure(call: Callable[[], object], repeat: int, warmup: int = 3) -> tuple[float, float]:
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return percentiles(samples)


def check(result: object) -> object:
    ok = getattr(result, "ok", None)
    code = getattr(result, "returncode", 0)
    if ok is False or code != 0:
        raise RuntimeError(f"benchmark command failed: {result}")
    return result


def bare(command: str | list[str]) -> object:
    return check(subprocess.run(command, shell=isinstance(command, str), capture_output=True))


def inside(target: object, command: str | list[str]) -> object:
    return check(target.run(command))  # type: ignore[attr-defined]


WORKLOADS = {"echo hi": "echo hi", "python 10 lines": [PYTHON, "-c", PYTHON_SCRIPT]}


def latency_rows(repeats: dict[str, int]) -> list[tuple[str, str, float, float]]:
    rows: list[tuple[str, str, float, float]] = []
    backends = [name for name in ("bwrap", "docker") if backend_problem(name) is None]
    for workload, command in WORKLOADS.items():
        repeat = repeats[workload]
        in_sandbox = command if isinstance(command, str) else ["python3", *command[1:]]
        rows.append((workload, "bare subprocess.run", *measure(partial(bare, command), repeat)))
        for backend in backends:
            with make(backend) as sb:
                rows.append((workload, f"{backend} cold", *measure(partial(inside, sb, in_sandbox), repeat)))
            with SandboxPool(size=1, backend=backend) as pool, pool.acquire() as sb:
                session = sb.session()
                rows.append((workload, f"{backend} warm pooled session",
                             *measure(partial(inside, session, in_sandbox), repeat)))
    return rows


def throughput(calls: list[Callable[[], object]], seconds: float) -> float:
    """Commands per second with one thread per call, each running it in a loop."""
    counts = [0] * len(calls)
    stop = threading.Event()
    start_line = threading.Barrier(len(calls) + 1)

    def loop(index: int) -> None:
        start_line.wait()
        while not stop.is_set():
            calls[index]()
            counts[index] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    start_line.wait()
    began = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.perf_counter() - began)


def throughput_rows(seconds: float) -> list[tuple[str, int, float, float]]:
    rows = []
    backends = [name for name in ("bwrap", "docker") if backend_problem(name) is None]
    for concurrency in (2, 8):
        baseline = throughput([partial(bare, "echo hi")] * concurrency, seconds)
        rows.append(("bare subprocess.run", concurrency, baseline, 1.0))
        for backend in backends:
            with SandboxPool(size=concurrency, backend=backend, prestart=True) as pool:
                held = [pool.acquire() for _ in range(concurrency)]
                sandboxes = [ctx.__enter__() for ctx in held]
                sessions = [sb.session() for sb in sandboxes]
                warm = throughput([partial(inside, s, "echo hi") for s in sessions], seconds)
                cold = throughput([partial(inside, sb, "echo hi") for sb in sandboxes], seconds)
                for ctx in held:
                    ctx.__exit__(None, None, None)
            rows.append((f"{backend} warm sessions", concurrency, warm, warm / baseline))
            rows.append((f"{backend} cold runs", concurrency, cold, cold / baseline))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    repeat_echo, repeat_py, seconds = (60, 15, 1.0) if args.quick else (300, 60, 3.0)
    repeats = {"echo hi": repeat_echo, "python 10 lines": repeat_py}
    for name in ("bwrap", "docker"):
        problem = backend_problem(name)
        if problem:
            print(f"({name} skipped: {problem})")

    print(f"\nLatency (p50 / p99 in ms; ratio = p50 / bare p50), {repeat_echo} x echo, {repeat_py} x python")
    print(f"{'workload':16} {'runner':28} {'p50':>8} {'p99':>8} {'ratio':>7}")
    rows = latency_rows(repeats)
    bare_p50 = {workload: p50 for workload, runner, p50, _ in rows if runner.startswith("bare")}
    for workload, runner, p50, p99 in rows:
        print(f"{workload:16} {runner:28} {p50 * 1e3:8.2f} {p99 * 1e3:8.2f} {p50 / bare_p50[workload]:6.2f}x")

    print(f"\nThroughput of `echo hi` (commands/s over {seconds:.0f} s; ratio = vs bare at the same "
          "concurrency)")
    print(f"{'runner':28} {'concurrent':>10} {'cmd/s':>9} {'ratio':>7}")
    for runner, concurrency, rate, ratio in throughput_rows(seconds):
        print(f"{runner:28} {concurrency:>10} {rate:9.0f} {ratio:6.2f}x")

    lookup = {(workload, runner): p50 for workload, runner, p50, _ in rows}
    if ("echo hi", "bwrap cold") in lookup:
        warm_ratio = lookup[("echo hi", "bwrap warm pooled session")] / bare_p50["echo hi"]
        cold_ms = lookup[("echo hi", "bwrap cold")] * 1e3
        print(f"\nTargets: warm session p50 = {warm_ratio:.2f}x bare (target <= 2x: "
              f"{'met' if warm_ratio <= 2 else 'MISSED'}); cold bwrap p50 = {cold_ms:.1f} ms "
              f"(target < 20 ms: {'met' if cold_ms < 20 else 'MISSED'})")


if __name__ == "__main__":
    main()
