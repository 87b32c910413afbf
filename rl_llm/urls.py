"""URLs the agents, envs and integrations share: ``is_http_url`` (is this string an http(s) URL at all),
``check_server_url`` (can requests be sent to it) and ``shown_url`` (how messages show it)."""

from __future__ import annotations

from typing import Any


def is_http_url(text: str) -> bool:
    """Whether ``text`` starts with ``http://`` or ``https://``, in any case: URL schemes are case-blind
    (RFC 3986), and ``HTTP://host`` was once taken for a model path."""
    return text[:8].lower().startswith(("http://", "https://"))


def check_server_url(name: str, value: Any) -> str:
    """``value`` when requests can be sent to it, else a ``ValueError`` naming ``name`` and saying why. httpx
    would only fail at the first request, deep inside its transport: an invalid port, no host, a query that
    the request paths would follow. The message shows the URL without its credentials (``shown_url``)."""
    import httpx  # here: the core's other modules stay importable without it

    def refuse(needs: str) -> ValueError:
        shown = repr(shown_url(value) if isinstance(value, str) else value)
        return ValueError(f"{name} must be a server URL {needs}, such as http://127.0.0.1:8000, got {shown}")

    if not isinstance(value, str):
        raise refuse("(a string)")
    try:
        url = httpx.URL(value)
    except httpx.InvalidURL as error:
        raise refuse(f"that parses ({error})") from None
    if url.scheme not in ("http", "https"):
        raise refuse("starting with http:// or https://")
    if not url.host:
        raise refuse("with a host")
    if url.port is not None and not 0 < url.port < 65536:
        raise refuse("with a port in 1-65535")
    if url.query or url.fragment:
        raise refuse("without a query or fragment (request paths are appended to it)")
    return value


def shown_url(url: str) -> str:
    """``url`` as names and messages show it: credentials in it (``https://user:key@host/v1``, or a token as the
    user name) as ``***``. A policy's name goes into every trajectory record, bench result and log line."""
    import httpx

    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return url
    return str(parsed.copy_with(username="***", password=None)) if parsed.userinfo else url
