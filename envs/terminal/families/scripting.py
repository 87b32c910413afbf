"""Family ``scripting``: write an executable that the check runs on inputs the agent never saw."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from rl_llm.envs.terminal.families.common import WHERE, WORDS, Draft, pick, text_lines, write_file_cmd

Case = dict[str, Any]


def _draft(name: str, contract: str, example: str, cases: list[Case], script: str) -> Draft:
    path = f"bin/{name}"
    return Draft(
        description=(
            f"Write an executable program `{path}` (any language available in the shell; remember the "
            f"shebang line and the execute permission). {contract} It will be tested on inputs you have not "
            f"seen. Example: {example} {WHERE}"
        ),
        files={},
        checks=[{"kind": "script_io", "path": path, "cases": cases}],
        solution=[write_file_cmd(path, script), f"chmod +x {path}"],
    )


def _cases(rng: random.Random, count: int, make: Callable[[random.Random, int], Case]) -> list[Case]:
    return [make(rng, index) for index in range(count)]


COLSUM = r"""#!/bin/bash
awk -F, -v col="$2" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == col) c = i
  if (!c) { print "no such column" > "/dev/stderr"; exit 2 }; next }
  { s += $c } END { if (c) print s + 0 }' "$1"
"""


def column_sum(rng: random.Random, difficulty: int) -> Draft:
    def make(rng: random.Random, index: int) -> Case:
        columns = pick(rng, WORDS, rng.randint(2, 5))
        low = -500 if difficulty >= 2 else 0
        rows = [[rng.randint(low, 1000) for _ in columns] for _ in range(rng.randint(0 if index else 1, 12))]
        text = ",".join(columns) + "\n" + "".join(",".join(map(str, row)) + "\n" for row in rows)
        if difficulty >= 3 and index == 0:
            return {"args": ["{dir}/data.csv", "missing_" + columns[0]], "files": {"data.csv": text}, "exit_code": 2,
                    "stdout": ""}
        which = rng.randrange(len(columns))
        return {"args": ["{dir}/data.csv", columns[which]], "files": {"data.csv": text},
                "stdout": f"{sum(row[which] for row in rows)}\n"}

    missing = " If the column does not exist, print nothing on stdout and exit with status 2." if difficulty >= 3 else ""
    return _draft(
        "colsum",
        "It takes two arguments, the path of a CSV file with a header row and integer values, and a column "
        f"name, and prints the sum of that column's values (0 when there are no data rows).{missing}",
        "for a file with the lines `a,b`, `1,2`, `3,4`, `bin/colsum FILE b` prints `6`.",
        _cases(rng, 3 + difficulty, make),
        COLSUM,
    )


LINESTATS = r"""#!/bin/bash
awk '{ w += NF; if (length($0) > m) m = length($0) } END { print NR, w + 0, m + 0 }'
"""


def line_stats(rng: random.Random, difficulty: int) -> Draft:
    def make(rng: random.Random, index: int) -> Case:
        text = text_lines(rng, rng.randint(0 if index == 1 else 1, 10))
        if difficulty >= 2:
            text = text.replace(" ", "   ", 2) + ("\n" if rng.random() < 0.5 else "")
        lines = text.splitlines()
        stdout = f"{len(lines)} {sum(len(line.split()) for line in lines)} {max(map(len, lines), default=0)}\n"
        return {"stdin": text, "stdout": stdout}

    return _draft(
        "linestats",
        "It reads text on standard input and prints one line `LINES WORDS LONGEST`: the number of lines, the "
        "number of whitespace-separated words, and the length in characters of the longest line (0 0 0 for "
        "empty input).",
        "for the input `a bb\\nccc\\n` it prints `2 3 4`.",
        _cases(rng, 2 + difficulty, make),
        LINESTATS,
    )


GETCONF = r"""#!/usr/bin/env python3
import sys
value = None
for line in open(sys.argv[1], encoding="utf-8"):
    line = line.strip()
    if line and not line.startswith("#") and "=" in line:
        key, _, rest = line.partition("=")
        if key.strip() == sys.argv[2]:
            value = rest.strip()
if value is None:
    sys.exit(1)
print(value)
"""


def config_lookup(rng: random.Random, difficulty: int) -> Draft:
    def make(rng: random.Random, index: int) -> Case:
        keys = pick(rng, WORDS, rng.randint(2, 6))
        values = {key: rng.choice((str(rng.randint(0, 999)), rng.choice(WORDS), "a=b")) for key in keys}
        lines = [f"# {rng.choice(WORDS)}"] + [f"{k}={v}" for k, v in values.items()]
        if difficulty >= 2:  # a later assignment wins; spaces around keys and values are not part of them
            override = rng.choice(keys)
            values[override] = rng.choice(WORDS)
            lines.append(f"  {override} = {values[override]}  ")
        if index == 0:
            return {"args": ["{dir}/app.conf", "absent_key"], "files": {"app.conf": "\n".join(lines)}, "exit_code": 1,
                    "stdout": ""}
        key = rng.choice(keys)
        return {"args": ["{dir}/app.conf", key], "files": {"app.conf": "\n".join(lines) + "\n"},
                "stdout": values[key] + "\n"}

    return _draft(
        "getconf",
        "It takes a config file path and a key. The file has `key=value` lines, blank lines and `#` comment "
        "lines; only the first `=` separates key and value, spaces around the key and the value are ignored, "
        "and if a key is set several times the last setting wins. Print the key's value, or, if the key is "
        "not set, print nothing and exit with status 1.",
        "with a file containing `port=80`, `bin/getconf FILE port` prints `80`.",
        _cases(rng, 3 + difficulty, make),
        GETCONF,
    )


FIZZ = r"""#!/bin/bash
for ((i = 1; i <= $1; i++)); do
  out=""
  (( i % $2 == 0 )) && out="Fizz"
  (( i % $3 == 0 )) && out="${out}Buzz"
  echo "${out:-$i}"
done
"""


def fizzbuzz(rng: random.Random, difficulty: int) -> Draft:
    def make(rng: random.Random, index: int) -> Case:
        n, a, b = rng.randint(0 if index == 1 else 1, 40 * difficulty), rng.randint(2, 7), rng.randint(2, 9)
        lines = [("Fizz" * (i % a == 0) + "Buzz" * (i % b == 0)) or str(i) for i in range(1, n + 1)]
        return {"args": [str(n), str(a), str(b)], "stdout": "".join(line + "\n" for line in lines)}

    return _draft(
        "fizz",
        "It takes three positive integers N, A and B and prints the numbers 1 to N, one per line, except that "
        "multiples of A print `Fizz`, multiples of B print `Buzz`, and multiples of both print `FizzBuzz`.",
        "`bin/fizz 4 2 3` prints `1`, `Fizz`, `Buzz`, `Fizz` on four lines.",
        _cases(rng, 2 + difficulty, make),
        FIZZ,
    )


REVERSE = r"""#!/bin/bash
awk '{ line = ""; for (i = NF; i > 0; i--) line = line $i (i > 1 ? " " : ""); print line }'
"""


def reverse_words(rng: random.Random, difficulty: int) -> Draft:
    def make(rng: random.Random, index: int) -> Case:
        text = text_lines(rng, rng.randint(1, 8), 1, 6)
        if difficulty >= 2:
            text = "  " + text.replace(" ", "\t", 1) + "\n"  # tabs, leading blanks and an empty line
        expected = "".join(" ".join(reversed(line.split())) + "\n" for line in text.splitlines())
        return {"stdin": text, "stdout": expected}

    return _draft(
        "revwords",
        "It reads text on standard input and prints each line with its whitespace-separated words in "
        "reverse order, joined by single spaces (an empty or blank line prints as an empty line).",
        "the input `one two  three` prints `three two one`.",
        _cases(rng, 2 + difficulty, make),
        REVERSE,
    )


VARIANTS = {
    "column_sum": column_sum,
    "line_stats": line_stats,
    "config_lookup": config_lookup,
    "fizzbuzz": fizzbuzz,
    "reverse_words": reverse_words,
}
