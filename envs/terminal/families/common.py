"""Shared pieces of the task families: the draft record, vocabularies and small text helpers."""

from __future__ import annotations

import random
import shlex
from dataclasses import dataclass
from typing import Any

# Every generated description ends with this, so the agent knows where paths are rooted.
WHERE = "All paths are relative to your home directory (the shell starts there)."


@dataclass
class Draft:
    """What a family's variant builds; ``generator.generate_task`` turns it into a ``TerminalTask``."""

    description: str
    files: dict[str, str | bytes]
    checks: list[dict[str, Any]]
    solution: list[str]
    setup: str = ""


WORDS = ["amber", "anchor", "apple", "arrow", "aspen", "atlas", "badge", "basil", "beacon", "birch", "blossom", "bolt", "breeze", "bridge", "brook", "cabin", "canyon", "cedar", "cinder", "citrus", "clover", "comet", "coral", "cotton", "crane", "crystal", "dawn", "delta", "dune", "eagle", "echo", "ember", "falcon", "fern", "field", "flint", "forest", "fossil", "frost", "garnet", "glacier", "granite", "harbor", "hazel", "heron", "hollow", "honey", "indigo", "iris", "island", "ivory", "jade", "jasper", "juniper", "kelp", "kernel", "lagoon", "lantern", "laurel", "lemon", "lilac", "linen", "lotus", "lunar", "maple", "marble", "meadow", "mint", "mist", "moss", "nectar", "noble", "nova", "oak", "ocean", "olive", "onyx", "orbit", "orchid", "otter", "pebble", "pepper", "pine", "plume", "polar", "poppy", "prism", "quartz", "quill", "raven", "reed", "ridge", "river", "robin", "rowan", "saffron", "sage", "salt", "sandal", "sierra", "silver", "slate", "solar", "sparrow", "spruce", "stone", "summit", "sunset", "swift", "thistle", "thunder", "timber", "topaz", "tulip", "tundra", "umber", "valley", "velvet", "violet", "walnut", "willow", "winter", "wren", "yarrow", "zephyr"]
FIRST_NAMES = ["Ada", "Alan", "Alice", "Amir", "Ana", "Ben", "Bianca", "Carla", "Chen", "Dana", "David", "Elena", "Emil", "Eva", "Farah", "Felix", "Grace", "Hana", "Hugo", "Ines", "Ivan", "Jade", "Jonas", "Kai", "Karin", "Lena", "Leo", "Lucia", "Maya", "Milan", "Nadia", "Nina", "Omar", "Oscar", "Paula", "Priya", "Quinn", "Rafael", "Rosa", "Sami", "Sara", "Tariq", "Tess", "Uma", "Victor", "Wen", "Xavier", "Yara", "Yusuf", "Zoe"]
LAST_NAMES = ["Adams", "Baker", "Brooks", "Castillo", "Chang", "Diaz", "Evans", "Fischer", "Garcia", "Gupta", "Hansen", "Ito", "Jensen", "Kim", "Kowalski", "Lopez", "Martin", "Meyer", "Nakamura", "Novak", "Okafor", "Olsen", "Patel", "Petrov", "Quinn", "Rossi", "Santos", "Schmidt", "Silva", "Tanaka", "Torres", "Usman", "Varga", "Weber", "Wong", "Yilmaz", "Young", "Zhang"]
CITIES = ["Austin", "Berlin", "Bogota", "Cairo", "Dublin", "Hanoi", "Lagos", "Lima", "Lisbon", "Madrid", "Manila", "Nairobi", "Oslo", "Osaka", "Paris", "Prague", "Quito", "Seoul", "Sydney", "Toronto", "Vienna", "Warsaw", "Zurich"]
COMPONENTS = ["api", "auth", "billing", "cache", "db", "gateway", "mailer", "queue", "scheduler", "search", "storage", "worker"]


def pick(rng: random.Random, pool: list[str] | tuple[str, ...], count: int) -> list[str]:
    """``count`` distinct items of ``pool`` in random order."""
    return rng.sample(list(pool), count)


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def text_lines(rng: random.Random, count: int, low: int = 3, high: int = 9) -> str:
    """``count`` lines of random words, newline-terminated."""
    return "".join(words(rng, rng.randint(low, high)) + "\n" for _ in range(count))


def stems(rng: random.Random, count: int, difficulty: int) -> list[str]:
    """Distinct file-name stems; at difficulty 3 some contain a space, which naive shell loops break on."""
    found: list[str] = []
    while len(found) < count:
        stem = rng.choice(WORDS) + rng.choice(("", "_", "-")) + rng.choice(WORDS)
        if difficulty >= 3 and rng.random() < 0.3:
            stem = stem.replace("_", " ").replace("-", " ") if ("_" in stem or "-" in stem) else stem + " copy"
        if stem not in found:
            found.append(stem)
    return found


def q(text: str) -> str:
    """Shell-quote one word."""
    return shlex.quote(text)


def write_file_cmd(path: str, content: str) -> str:
    """An oracle command that writes ``content`` exactly to ``path`` (creating its directory)."""
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    prefix = f"mkdir -p {q(parent)} && " if parent else ""
    return f"{prefix}printf '%s' {q(content)} > {q(path)}"


def python_cmd(source: str) -> str:
    """An oracle command that runs a short Python program with the sandbox's python3."""
    return f"python3 -c {q(source)}"
