"""Family ``text``: line-oriented text transformations (dedupe, substitute, reformat, rank)."""

from __future__ import annotations

import random
import re
from collections import Counter

from rl_llm.envs.terminal.families.common import (
    FIRST_NAMES,
    LAST_NAMES,
    WHERE,
    WORDS,
    Draft,
    pick,
    stems,
    text_lines,
)


def dedupe_lines(rng: random.Random, difficulty: int) -> Draft:
    vocabulary = pick(rng, WORDS, 6 + 4 * difficulty)
    if difficulty >= 2:  # lines differing only in case or trailing text are distinct lines
        vocabulary += [vocabulary[0].capitalize(), vocabulary[1] + " " + vocabulary[2]]
    lines = [rng.choice(vocabulary) for _ in range(15 + 15 * difficulty)]
    unique = list(dict.fromkeys(lines))
    return Draft(
        description=(
            "`words.txt` has one entry per line, with repeats. Write `unique.txt` with each distinct line only "
            f"once, keeping the order of first appearance (lines are compared exactly, case-sensitively). {WHERE}"
        ),
        files={"words.txt": "\n".join(lines) + "\n"},
        checks=[{"kind": "file_text", "path": "unique.txt", "expected": "\n".join(unique), "mode": "lines"}],
        solution=["awk '!seen[$0]++' words.txt > unique.txt"],
    )


def replace_word(rng: random.Random, difficulty: int) -> Draft:
    old, new = pick(rng, [w for w in WORDS if len(w) >= 4], 2)
    names = stems(rng, 2 + difficulty, min(difficulty, 2))
    files: dict[str, str | bytes] = {}
    for name in names:
        lines = text_lines(rng, rng.randint(3, 6)).splitlines()
        for _ in range(rng.randint(1, 3)):
            index = rng.randrange(len(lines))
            lines[index] = f"{lines[index]} {old} {rng.choice(WORDS)}"
        if difficulty >= 2:  # the word inside longer words must stay
            lines.append(f"{old}s and {old}ful and pre{old}")
        files[f"docs/{name}.md"] = "\n".join(lines) + "\n"
    files["docs/keep.txt"] = f"{old} stays here\n"  # not a .md file
    pattern = re.compile(rf"\b{re.escape(old)}\b")
    expected = {p[len("docs/") :]: (pattern.sub(new, c) if p.endswith(".md") else c) for p, c in files.items()}
    return Draft(
        description=(
            f"In every `.md` file in `docs/`, replace each occurrence of the whole word `{old}` with `{new}` "
            f"(occurrences inside longer words such as `{old}s` stay unchanged). Do not touch other files. {WHERE}"
        ),
        files=files,
        checks=[{"kind": "dir_files", "path": "docs", "expected": expected}],
        solution=[f"sed -i 's/\\b{old}\\b/{new}/g' docs/*.md"],
    )


def reorder_names(rng: random.Random, difficulty: int) -> Draft:
    count = 5 + 4 * difficulty
    ages = rng.sample(range(18, 90), count)
    people = [(rng.choice(LAST_NAMES), rng.choice(FIRST_NAMES), age) for age in ages]
    text = "".join(f"{last}, {first}: {age}\n" for last, first, age in people)
    if difficulty >= 2:
        text = "# last, first: age\n" + text.replace(": ", ":  ", 2)  # a comment and irregular spacing
    expected = [f"{first} {last}" for last, first, _ in sorted(people, key=lambda p: p[2])]
    return Draft(
        description=(
            "Each line of `people.txt` reads `Last, First: age` (lines starting with `#` are comments). Write "
            "`names.txt` with one `First Last` per line (single space), ordered from youngest to oldest. "
            f"{WHERE}"
        ),
        files={"people.txt": text},
        checks=[{"kind": "file_text", "path": "names.txt", "expected": "\n".join(expected), "mode": "lines"}],
        solution=[
            "grep -v '^#' people.txt | awk -F'[,:] *' '{print $3, $2, $1}' | sort -n | cut -d' ' -f2- > names.txt"
        ],
    )


def settings_to_env(rng: random.Random, difficulty: int) -> Draft:
    keys = pick(rng, WORDS, 4 + 2 * difficulty)
    lines, expected = [], []
    for key in keys:
        value = rng.choice((str(rng.randint(1, 9999)), rng.choice(WORDS), f"/srv/{rng.choice(WORDS)}"))
        if difficulty >= 2 and rng.random() < 0.3:
            lines.append(f"# {key} is {rng.choice(WORDS)}")
        name = f"{key}_{rng.choice(('path', 'size', 'mode'))}"
        spaces = " " * rng.randint(1, difficulty)
        lines.append(f"{name}{spaces}={spaces}{value}")
        if difficulty >= 3 and rng.random() < 0.3:
            lines.append("")
        expected.append(f"{name.upper()}={value}")
    return Draft(
        description=(
            "`settings.txt` has lines `key = value` (possibly with extra spaces), comment lines starting with "
            "`#` and blank lines. Write `settings.env` with one `KEY=value` line per setting, in the same "
            "order: the key in upper case, no spaces around `=`, the value unchanged. Skip comments and blank "
            f"lines. {WHERE}"
        ),
        files={"settings.txt": "\n".join(lines) + "\n"},
        checks=[{"kind": "file_text", "path": "settings.env", "expected": "\n".join(expected), "mode": "lines"}],
        solution=[
            "grep -v -e '^#' -e '^ *$' settings.txt | awk -F' *= *' '{print toupper($1) \"=\" $2}' > settings.env"
        ],
    )


def word_frequency(rng: random.Random, difficulty: int) -> Draft:
    top = 2 + difficulty
    vocabulary = pick(rng, WORDS, top + 6)
    counts = dict(zip(vocabulary, sorted(rng.sample(range(3, 30), len(vocabulary)), reverse=True)))
    tokens = [word for word, n in counts.items() for _ in range(n)]
    rng.shuffle(tokens)
    lines, position = [], 0
    while position < len(tokens):
        step = rng.randint(3, 9)
        chunk = tokens[position : position + step]
        if difficulty >= 2:  # capitals and punctuation: words are compared case-insensitively
            chunk = [w.capitalize() if rng.random() < 0.2 else w for w in chunk]
            chunk[-1] += rng.choice((".", ",", "!", ";"))
        lines.append(" ".join(chunk))
        position += step
    ranking = Counter(tokens).most_common(top)
    return Draft(
        description=(
            f"Find the {top} most frequent words in `essay.txt` (a word is a run of letters; compare words "
            f"case-insensitively and report them in lower case). Write `top_words.txt` with one `word count` "
            f"line each (single space), the most frequent first. {WHERE}"
        ),
        files={"essay.txt": "\n".join(lines) + "\n"},
        checks=[{"kind": "file_text", "path": "top_words.txt",
                 "expected": "".join(f"{w} {n}\n" for w, n in ranking), "mode": "lines"}],
        solution=[
            f"tr -cs 'A-Za-z' '\\n' < essay.txt | tr 'A-Z' 'a-z' | grep -v '^$' | sort | uniq -c | "
            f"sort -k1,1nr | head -n {top} | awk '{{print $2, $1}}' > top_words.txt"
        ],
    )


VARIANTS = {
    "dedupe_lines": dedupe_lines,
    "replace_word": replace_word,
    "reorder_names": reorder_names,
    "settings_to_env": settings_to_env,
    "word_frequency": word_frequency,
}
