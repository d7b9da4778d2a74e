"""Capping tool output at a byte budget with an explicit marker."""

from __future__ import annotations


def truncation_marker(dropped_bytes: int) -> str:
    """The marker appended to truncated output."""
    return f"…[truncated {dropped_bytes} bytes]"


def truncate_text(text: str, cap_bytes: int) -> tuple[str, bool]:
    """Cut `text` to at most `cap_bytes` UTF-8 bytes of content, then append the truncation marker.

    The cut never splits a character. Returns the (possibly) shortened text and whether it was cut.
    """
    if len(text) <= cap_bytes // 4:  # fast path: even 4-byte characters fit
        return text, False
    data = text.encode("utf-8", errors="surrogatepass")
    if len(data) <= cap_bytes:
        return text, False
    head = data[:cap_bytes].decode("utf-8", errors="ignore")
    dropped = len(data) - len(head.encode("utf-8", errors="surrogatepass"))
    return head + truncation_marker(dropped), True
