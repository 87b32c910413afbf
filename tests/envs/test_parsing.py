"""Tag and tool-call parsing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl_llm.envs.parsing import (
    extract_all_tags,
    extract_tag,
    first_of_tags,
    parse_json_tool_calls,
    truncate_middle,
)


def test_extract_tag_first_last_and_unclosed() -> None:
    text = "<a>one</a> x <a> two </a> <a>unclosed"
    assert extract_tag(text, "a") == "one"
    assert extract_tag(text, "a", last=True) == "two"
    assert extract_tag("<a>never closed", "a") is None
    assert extract_tag("</a>close before open<a>", "a") is None
    assert extract_tag("<b>x</b>", "a") is None


def test_extract_tag_nested_takes_the_innermost_closing_match() -> None:
    assert extract_tag("<a>outer <a>inner</a> tail</a>", "a") == "outer <a>inner"
    assert extract_tag("<a>outer <a>inner</a> tail</a>", "a", last=True) == "inner</a> tail"


def test_extract_all_tags_in_order_with_limit() -> None:
    text = "".join(f"<q>{i}</q>" for i in range(60))
    assert extract_all_tags(text, "q")[:3] == ["0", "1", "2"]
    assert len(extract_all_tags(text, "q", limit=51)) == 51


def test_first_of_tags_picks_the_earliest_complete_action() -> None:
    assert first_of_tags("<answer>x</answer><search>y</search>", ("search", "answer")) == ("answer", "x")
    assert first_of_tags("<search>unclosed <answer>x</answer>", ("search", "answer")) == ("answer", "x")
    assert first_of_tags("nothing", ("search", "answer")) is None


def test_truncate_middle_keeps_head_and_tail_and_says_how_much_was_cut() -> None:
    text = "a" * 50 + "b" * 50
    cut = truncate_middle(text, 20)
    assert cut.startswith("a" * 10) and cut.endswith("b" * 10) and "80 characters truncated" in cut
    assert truncate_middle("short", 20) == "short"


@given(st.text(), st.sampled_from(["a", "move", "sql"]))
def test_extract_tag_content_round_trips(content: str, tag: str) -> None:
    if f"</{tag}>" in content:
        return
    assert extract_tag(f"pre <{tag}>{content}</{tag}> post", tag) == content.strip()


def test_json_tool_calls_in_tags_openai_wire_form_and_bare_json() -> None:
    calls = parse_json_tool_calls('<tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call>')
    assert calls[0].name == "search" and calls[0].arguments == {"query": "x"} and calls[0].error is None
    wire = '<tool_call>{"type": "function", "function": {"name": "calc", "arguments": "{\\"expr\\": \\"1+1\\"}"}}</tool_call>'
    assert parse_json_tool_calls(wire)[0].arguments == {"expr": "1+1"}
    bare = 'I will call {"name": "search", "arguments": {"query": "y"}} now'
    assert parse_json_tool_calls(bare)[0].arguments == {"query": "y"}


@pytest.mark.parametrize(
    ("text", "error"),
    [("<tool_call>{not json}</tool_call>", "not valid JSON"),
     ("<tool_call>[1, 2]</tool_call>", "JSON object"),
     ('<tool_call>{"arguments": {}}</tool_call>', "no string 'name'"),
     ('<tool_call>{"name": "x", "arguments": "{bad"}</tool_call>', "'arguments' is not valid JSON"),
     ('<tool_call>{"name": "x", "arguments": [1]}</tool_call>', "must be a JSON object")],
)
def test_malformed_tool_calls_carry_a_specific_error(text: str, error: str) -> None:
    (call,) = parse_json_tool_calls(text)
    assert call.error is not None and error in call.error


def test_tool_call_count_is_capped_one_past_the_limit() -> None:
    text = '<tool_call>{"name": "a"}</tool_call>' * 50
    assert len(parse_json_tool_calls(text, limit=16)) == 17


@pytest.mark.parametrize(
    ("text", "error"),
    [('<tool_call>{"name": "x", "arguments": ' + "[" * 100_000 + "</tool_call>", "tool call is not valid JSON"),
     ('{"name": "x", "arguments": ' + "[" * 100_000, "tool call is not valid JSON"),
     ('<tool_call>{"name": "x", "arguments": "' + "[" * 100_000 + '"}</tool_call>', "'arguments' is not valid JSON")],
    ids=["in-tags", "bare", "arguments-string"],
)
def test_deeply_nested_json_is_a_malformed_call_not_a_recursion_error(text: str, error: str) -> None:
    (call,) = parse_json_tool_calls(text)
    assert call.error is not None and error in call.error and "nested too deeply" in call.error
