"""Output capping by UTF-8 bytes with an explicit marker."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from mcprl_tools import truncate_text, truncation_marker


@given(text=st.text(), cap=st.integers(min_value=64, max_value=4096))
@example(text="é" * 100, cap=65)
@example(text="😀" * 100, cap=66)
def test_truncated_text_keeps_a_prefix_within_the_cap_and_counts_what_was_dropped(
    text: str, cap: int
) -> None:
    out, truncated = truncate_text(text, cap)
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size <= cap:
        assert not truncated
        assert out == text
        return
    assert truncated
    head, marker = out.rsplit("…[truncated ", 1)
    assert text.startswith(head)
    head_size = len(head.encode("utf-8", errors="surrogatepass"))
    assert cap - 3 <= head_size <= cap
    assert out == head + truncation_marker(size - head_size)
    assert marker.endswith(" bytes]")


def test_output_at_the_cap_is_untouched() -> None:
    assert truncate_text("a" * 100, 100) == ("a" * 100, False)
    assert truncate_text("a" * 101, 100) == ("a" * 100 + "…[truncated 1 bytes]", True)
