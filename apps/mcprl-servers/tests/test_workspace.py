from __future__ import annotations

import threading
from pathlib import Path

import pytest

from mcprl_servers.workspace import Workspace, WorkspaceError
from mcprl_servers.workspace_seed import POST_CHANNELS, SEED_MESSAGES


def test_seed_messages_in_post_channels_hold_no_digits() -> None:
    for channel, _, _, text in SEED_MESSAGES:
        if channel in POST_CHANNELS:
            assert not any(ch.isdigit() for ch in text), text


def test_least_recently_used_episodes_are_evicted_beyond_the_cap() -> None:
    ws = Workspace(max_episodes=2)
    ws.post("a", "general", "from a")
    ws.post("b", "general", "from b")
    ws.read("a", "general")  # reading does not count as use; posting does
    ws.post("c", "general", "from c")
    assert "from a" not in [m["text"] for m in ws.read("a", "general")["messages"]]
    assert ws.read("b", "general")["messages"][-1]["text"] == "from b"
    assert ws.read("c", "general")["messages"][-1]["text"] == "from c"


def test_channel_names_are_normalised() -> None:
    ws = Workspace()
    assert ws.post("e", " #Markets ", "hi") == {"ok": True, "channel": "markets"}
    with pytest.raises(WorkspaceError, match="Unknown channel"):
        ws.read("e", "#nowhere")


def test_posts_from_many_threads_stay_in_their_episodes() -> None:
    ws = Workspace()
    barrier = threading.Barrier(8)

    def worker(n: int) -> None:
        barrier.wait()
        for i in range(50):
            ws.post(f"t{n}", "reports", f"t{n}-{i}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n in range(8):
        texts = [m["text"] for m in ws.read(f"t{n}", "reports", limit=100)["messages"]]
        assert texts[-50:] == [f"t{n}-{i}" for i in range(50)]
        assert all(not t.startswith("t") or t.startswith(f"t{n}-") for t in texts)


def test_sqlite_file_backend_works(tmp_path: Path) -> None:
    ws = Workspace(str(tmp_path / "ws.sqlite"))
    ws.post("x", "general", "persisted")
    assert ws.read("x", "general")["messages"][-1]["text"] == "persisted"
    ws.close()
