"""Shared test fixtures and hypothesis strategies."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# CI runs with a fixed, moderate budget; `HYPOTHESIS_PROFILE=thorough` for longer local fuzzing.
settings.register_profile(
    "ci", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.register_profile("thorough", max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Tag fragments every env parser meets: complete, unclosed, nested and misspelled tags of all envs.
TAG_FRAGMENTS = [
    f"{prefix}{tag}{suffix}"
    for tag in ("action", "move", "sql", "solution", "search", "answer", "command", "python", "think", "tool_call",
                "message", "propose", "A", "B")
    for prefix, suffix in (("<", ">"), ("</", ">"), ("<", ""), ("<<", ">>"))
]


@st.composite
def hostile_text(draw: st.DrawFn) -> str:
    """Arbitrary LLM turns: Unicode, control characters, tag soup, valid-looking actions and huge strings."""
    kind = draw(st.sampled_from(["unicode", "tags", "mixed", "huge", "empty"]))
    if kind == "empty":
        return draw(st.sampled_from(["", " ", "\n", "\x00", "\r\n\t"]))
    if kind == "unicode":
        return draw(st.text(max_size=200))
    parts = st.one_of(st.sampled_from(TAG_FRAGMENTS), st.text(max_size=12), st.sampled_from(
        ["A", "B2", "2,2", "5", "SELECT 1", "ls", "done", "{\"name\": \"x\"}", "\x1b[31m", "\ufeff", "\ud7ff"]))
    text = "".join(draw(st.lists(parts, max_size=30)))
    if kind == "huge":
        return text * draw(st.integers(100, 3000)) + draw(st.sampled_from(TAG_FRAGMENTS))
    return text
