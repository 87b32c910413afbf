"""Incremental chat-template tokenisation: the observation delta for several template styles."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from rl_llm.agents.chat import ChatFormat
from rl_llm.types import Message

LLAMA3_STYLE = (
    "{{ '<|begin_of_text|>' }}{% for m in messages %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
COUNTS_MESSAGES = "{{ messages | length }}{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def with_template(tokenizer, template: str | None):
    clone = copy.deepcopy(tokenizer)
    clone.chat_template = template
    return clone


def test_chatml_delta_closes_the_turn_once(tokenizer) -> None:
    chat = ChatFormat(tokenizer)
    assert chat.assistant_close == "<|im_end|>\n"
    generated = tokenizer.encode("<move>B2</move>", add_special_tokens=False)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    expected = "<|im_end|>\n<|im_start|>user\nYour move?<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(chat.observation_ids("Your move?", generated)) == expected
    # The policy already produced the end-of-turn token: only the newline after it is added.
    assert tokenizer.decode(chat.observation_ids("Your move?", [*generated, eos])) == expected.removeprefix("<|im_end|>")
    # A completion ending in ordinary text that looks like the start of the close is not mistaken for it.
    lookalike = tokenizer.encode("<", add_special_tokens=False)
    assert tokenizer.decode(chat.observation_ids("Hi", lookalike)).startswith("<|im_end|>\n")


def test_incremental_tokens_equal_rendering_the_whole_conversation(tokenizer) -> None:
    chat = ChatFormat(tokenizer)
    messages = [Message("system", "Rules."), Message("user", "Board 1")]
    ids = chat.prompt_ids(messages)
    for turn, reply in enumerate(["<move>A1</move>", "<move>C3</move>"]):
        generated = tokenizer.encode(reply, add_special_tokens=False)
        ids += generated
        messages.append(Message("assistant", reply))
        observation = f"Board {turn + 2}"
        ids += chat.observation_ids(observation, generated)
        messages.append(Message("user", observation))
    assert tokenizer.decode(ids) == chat.render(messages, add_generation_prompt=True)


def test_other_template_styles_and_clear_errors(tokenizer) -> None:
    llama = ChatFormat(with_template(tokenizer, LLAMA3_STYLE))
    assert llama.assistant_close == "<|eot_id|>"
    delta = tokenizer.decode(llama.observation_ids("  padded  ", tokenizer.encode("x", add_special_tokens=False)))
    assert delta == "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\npadded<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    with pytest.raises(ValueError, match="prefix-stable"):
        ChatFormat(with_template(tokenizer, COUNTS_MESSAGES)).observation_ids("obs", [])
    with pytest.raises(ValueError, match="no chat template"):
        ChatFormat(with_template(tokenizer, None))
