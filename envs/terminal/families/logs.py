"""Family ``logs``: counting and extracting from application and web-server logs."""

from __future__ import annotations

import gzip
import random
from collections import Counter

from rl_llm.envs.terminal.families.common import COMPONENTS, WHERE, WORDS, Draft, pick, words

LEVELS = ("DEBUG", "INFO", "WARN", "ERROR")
METHODS = ("GET", "GET", "GET", "POST", "PUT", "DELETE")
STATUSES = (200, 200, 200, 200, 201, 301, 304, 403, 404, 500)
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def _app_lines(rng: random.Random, count: int, components: list[str]) -> list[tuple[str, str, str]]:
    """(timestamp, level, component) triples plus message text, in time order."""
    day = f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    seconds = sorted(rng.sample(range(86400), count))
    return [
        (f"{day} {s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}", rng.choice(LEVELS), rng.choice(components))
        for s in seconds
    ]


def _render_app(entries: list[tuple[str, str, str]], rng: random.Random) -> str:
    return "".join(f"{t} {level} [{component}] {words(rng, rng.randint(2, 7))}\n" for t, level, component in entries)


def error_counts(rng: random.Random, difficulty: int) -> Draft:
    level = rng.choice(("ERROR", "WARN"))
    components = pick(rng, COMPONENTS, 3 + difficulty)
    files: dict[str, str | bytes] = {}
    counts: Counter[str] = Counter()
    parts = ["app.log"] + [f"app.log.{i}" for i in range(1, difficulty)]
    for index, name in enumerate(parts):
        entries = _app_lines(rng, rng.randint(20, 30) * difficulty, components)
        counts.update(component for _, lvl, component in entries if lvl == level)
        text = _render_app(entries, rng)
        if difficulty >= 3 and index == len(parts) - 1:
            files[f"logs/{name}.gz"] = gzip.compress(text.encode(), mtime=0)
        else:
            files[f"logs/{name}"] = text
    rows = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    scope = "`logs/app.log`" if difficulty == 1 else "all the rotated logs `logs/app.log*` (including any gzipped one)"
    reader = "cat logs/app.log" if difficulty == 1 else "zcat -f logs/app.log*"
    return Draft(
        description=(
            f"Each line of {scope} looks like `DATE TIME LEVEL [component] message`. Count the {level} lines per "
            f"component and write `reports/{level.lower()}_counts.txt` with one line per component that has at "
            f"least one {level} line, formatted `component count` (single space), sorted by count descending, "
            f"ties broken by component name ascending. {WHERE}"
        ),
        files=files,
        checks=[{
            "kind": "file_text", "path": f"reports/{level.lower()}_counts.txt",
            "expected": "".join(f"{c} {n}\n" for c, n in rows), "mode": "lines",
        }],
        solution=[
            f"mkdir -p reports && {reader} | awk '$3==\"{level}\" {{gsub(/[][]/, \"\", $4); n[$4]++}} "
            f"END {{for (c in n) print c, n[c]}}' | LC_ALL=C sort -k2,2nr -k1,1 > reports/{level.lower()}_counts.txt"
        ],
    )


def _access_log(rng: random.Random, count: int, ips: list[str], weights: list[int]) -> list[tuple]:
    paths = [f"/{rng.choice(WORDS)}/{rng.choice(WORDS)}" for _ in range(6 + 2 * len(ips))]
    day, month = rng.randint(1, 28), rng.choice(MONTHS)
    entries = []
    for s in sorted(rng.sample(range(86400), count)):
        stamp = f"{day:02d}/{month}/2024:{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d} +0000"
        entries.append((rng.choices(ips, weights)[0], stamp, rng.choice(METHODS), rng.choice(paths),
                        rng.choice(STATUSES), rng.randint(100, 90000)))
    return entries


def _render_access(entries: list[tuple]) -> str:
    return "".join(f'{ip} - - [{t}] "{m} {p} HTTP/1.1" {s} {b}\n' for ip, t, m, p, s, b in entries)


def _ips(rng: random.Random, count: int) -> list[str]:
    found: list[str] = []
    while len(found) < count:
        ip = f"{rng.choice((10, 172, 192))}.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
        if ip not in found:
            found.append(ip)
    return found


def top_ips(rng: random.Random, difficulty: int) -> Draft:
    top = 2 + difficulty
    ips = _ips(rng, top + 3 + 2 * difficulty)
    # Distinct request counts for the leaders, so the ranking has no ties to break.
    leader_counts = sorted(rng.sample(range(12, 40), top + 1), reverse=True)
    plan = [ip for ip, n in zip(ips, leader_counts) for _ in range(n)]
    plan += [ip for ip in ips[top + 1 :] for _ in range(rng.randint(1, leader_counts[-1] - 1))]
    entries = _access_log(rng, len(plan), ips, [1] * len(ips))
    rng.shuffle(plan)
    entries = [(ip, *rest) for ip, (_, *rest) in zip(plan, entries)]
    ranking = [ip for ip, _ in Counter(plan).most_common(top)]
    return Draft(
        description=(
            f"`access.log` is a web server log in the common log format (the client IP is the first field). "
            f"Write the {top} client IPs with the most requests to `top_ips.txt`, one per line, the busiest "
            f"first. {WHERE}"
        ),
        files={"access.log": _render_access(entries)},
        checks=[{"kind": "file_text", "path": "top_ips.txt", "expected": "\n".join(ranking), "mode": "lines"}],
        solution=[f"awk '{{print $1}}' access.log | sort | uniq -c | sort -k1,1nr | head -n {top} | "
                  "awk '{print $2}' > top_ips.txt"],
    )


def paths_with_status(rng: random.Random, difficulty: int) -> Draft:
    status = rng.choice((404, 500, 403))
    entries = _access_log(rng, 30 + 20 * difficulty, _ips(rng, 6), [1] * 6)
    if not any(e[4] == status for e in entries):
        entries[rng.randrange(len(entries))] = (*entries[0][:4], status, 512)
    if difficulty >= 2:  # the status code also appears as a byte count, where a naive grep finds it
        entries.append((*entries[-1][:3], f"/{rng.choice(WORDS)}/{status}", 200, status))
    paths = sorted({e[3] for e in entries if e[4] == status}, key=str.encode)
    return Draft(
        description=(
            f"`access.log` is a web server log in the common log format. Write every distinct request path "
            f"that was answered with HTTP status {status} to `status_{status}.txt`, one per line, sorted in "
            f"plain byte order (`LC_ALL=C sort`), without duplicates. {WHERE}"
        ),
        files={"access.log": _render_access(entries)},
        checks=[{"kind": "file_text", "path": f"status_{status}.txt", "expected": "\n".join(paths), "mode": "lines"}],
        solution=[f"awk '$9=={status} {{print $7}}' access.log | LC_ALL=C sort -u > status_{status}.txt"],
    )


def bytes_for_client(rng: random.Random, difficulty: int) -> Draft:
    ips = _ips(rng, 3 + 2 * difficulty)
    entries = _access_log(rng, 30 + 25 * difficulty, ips, [3] + [1] * (len(ips) - 1))
    client = ips[0]
    status = 200 if difficulty == 1 else rng.choice((200, 304, 404))
    chosen = [e for e in entries if e[0] == client and e[4] == status]
    if not chosen:
        entries.append((client, *entries[-1][1:4], status, rng.randint(100, 90000)))
        chosen = [entries[-1]]
    total = sum(e[5] for e in chosen)
    return Draft(
        description=(
            f"`access.log` is a web server log in the common log format (the last field is the response size "
            f"in bytes). Write the total number of bytes sent to client {client} in responses with status "
            f"{status}, as a plain integer, to `bytes.txt`. {WHERE}"
        ),
        files={"access.log": _render_access(entries)},
        checks=[{"kind": "file_text", "path": "bytes.txt", "expected": str(total), "mode": "stripped"}],
        solution=[f"awk '$1==\"{client}\" && $9=={status} {{s+=$10}} END {{print s}}' access.log > bytes.txt"],
    )


def errors_in_window(rng: random.Random, difficulty: int) -> Draft:
    components = pick(rng, COMPONENTS, 4)
    entries = _app_lines(rng, 40 + 30 * difficulty, components)
    start = rng.randint(1, 20)
    end = start + rng.randint(1, 3)
    if not any(f"{start:02d}:00:00" <= e[0][11:] < f"{end:02d}:00:00" and e[1] == "ERROR" for e in entries):
        entries.append((f"{entries[0][0][:10]} {start:02d}:30:00", "ERROR", components[0]))
        entries.sort()
    text = _render_app(entries, rng)
    lines = [line for line in text.splitlines() if line.split(" ")[2] == "ERROR"
             and f"{start:02d}:00:00" <= line.split(" ")[1] < f"{end:02d}:00:00"]
    return Draft(
        description=(
            f"Each line of `service.log` looks like `DATE TIME LEVEL [component] message`. Copy every ERROR "
            f"line logged from {start:02d}:00:00 up to (not including) {end:02d}:00:00 into `window.log`, "
            f"unchanged and in their original order. {WHERE}"
        ),
        files={"service.log": text},
        checks=[{"kind": "file_text", "path": "window.log", "expected": "\n".join(lines), "mode": "lines"}],
        solution=[f"awk '$3==\"ERROR\" && $2>=\"{start:02d}:00:00\" && $2<\"{end:02d}:00:00\"' service.log > window.log"],
    )


VARIANTS = {
    "error_counts": error_counts,
    "top_ips": top_ips,
    "paths_with_status": paths_with_status,
    "bytes_for_client": bytes_for_client,
    "errors_in_window": errors_in_window,
}
