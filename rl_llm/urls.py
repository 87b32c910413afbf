"""``is_http_url``: the one test of "this string is an http(s) URL" that the agents and envs share."""

from __future__ import annotations


def is_http_url(text: str) -> bool:
    """Whether ``text`` starts with ``http://`` or ``https://``, in any case: URL schemes are case-blind
    (RFC 3986), and ``HTTP://host`` was once taken for a model path."""
    return text[:8].lower().startswith(("http://", "https://"))
