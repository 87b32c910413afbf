"""Incremental tokenisation of a conversation through the tokenizer's chat template.

The rollout engine renders the first prompt once (system prompt + first observation + the assistant
header) and afterwards only appends the tokens of what is new: the tokens the policy generated, as
generated, then the template's delta for the next observation (the close of the assistant turn, the user
turn, the next assistant header). History is never re-tokenised, so the token ids a trainer sees are
exactly the ones the generator conditioned on.

The delta is found by rendering a short fixed conversation with and without the new message and taking
the difference, which works for any template whose rendering of a conversation is a prefix of the
rendering of that conversation extended (ChatML, Llama 3, Mistral, ...); a template that is not raises a
clear error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rl_llm.types import Message

_SENTINEL = "\u2063rl-llm-assistant-sentinel\u2063"
_BASE = (Message("system", "system"), Message("user", "user"), Message("assistant", _SENTINEL))


class ChatFormat:
    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template; set tokenizer.chat_template")
        self.tokenizer = tokenizer
        self._base_text = self.render(_BASE, add_generation_prompt=False)
        at = self._base_text.rfind(_SENTINEL)
        if at < 0:
            raise ValueError("the chat template drops assistant content; cannot find where an assistant turn ends")
        # What the template writes after an assistant message's content, e.g. "<|im_end|>\n".
        self.assistant_close = self._base_text[at + len(_SENTINEL) :]
        self._special_ids = frozenset(tokenizer.all_special_ids)

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            [message.to_dict() for message in messages], tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The whole conversation with the assistant header appended, ready for generation."""
        return self.encode(self.render(messages, add_generation_prompt=True))

    def observation_ids(self, content: str, completion_ids: Sequence[int], role: str = "user") -> list[int]:
        """Tokens to append after an assistant completion so that a new ``role`` message follows.

        ``completion_ids`` are the tokens the policy generated for the turn being closed: when they already
        end with the template's end-of-turn special token (the eos), only the rest of the close is added.
        """
        full = self.render((*_BASE, Message(role, content)), add_generation_prompt=True)  # type: ignore[arg-type]
        if not full.startswith(self._base_text):
            raise ValueError("the chat template re-renders earlier turns differently; incremental tokenisation needs a prefix-stable template")
        return self.encode(self._close_after(completion_ids) + full[len(self._base_text) :])

    def _close_after(self, completion_ids: Sequence[int]) -> str:
        if completion_ids and completion_ids[-1] in self._special_ids:
            last = self.tokenizer.decode([completion_ids[-1]], skip_special_tokens=False)
            if self.assistant_close.startswith(last):
                return self.assistant_close[len(last) :]
        return self.assistant_close
