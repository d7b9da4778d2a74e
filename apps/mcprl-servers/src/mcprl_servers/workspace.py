"""The messaging workspace: a SQLite store of channels, users and messages with per-episode isolation.

Seed messages are shared read-only by every episode; messages posted during an episode are stored under its
id and only that episode sees them, so a fresh episode always starts from the seed state. Posting times are
deterministic (seed epoch + a per-episode counter), not wall-clock. The store keeps the most recently used
``max_episodes`` episodes and drops older ones' posts. All access goes through one lock, so the store is safe
to share between threads.
"""

from __future__ import annotations

import sqlite3
import threading
from typing import Any

from mcprl_servers.workspace_seed import SEED_CHANNELS, SEED_EPOCH, SEED_MESSAGES, SEED_USERS

__all__ = ["AGENT_USER", "MAX_MESSAGE_CHARS", "Workspace", "WorkspaceError"]

AGENT_USER = "agent"
MAX_MESSAGE_CHARS = 4000
_SEED = ""  # episode column value of seed rows (never a valid episode id after normalisation)

_SCHEMA = """
CREATE TABLE channels (name TEXT PRIMARY KEY, topic TEXT NOT NULL, members INTEGER NOT NULL);
CREATE TABLE users (name TEXT PRIMARY KEY, real_name TEXT NOT NULL, title TEXT NOT NULL);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    episode TEXT NOT NULL,
    channel TEXT NOT NULL REFERENCES channels(name),
    user TEXT NOT NULL,
    ts INTEGER NOT NULL,
    text TEXT NOT NULL
);
CREATE INDEX messages_by_episode ON messages (episode, channel, id);
CREATE TABLE episodes (episode TEXT PRIMARY KEY, last_used INTEGER NOT NULL, posts INTEGER NOT NULL);
"""


class WorkspaceError(ValueError):
    """A request the workspace refuses (unknown channel, empty text, ...); the message is model-facing."""


class Workspace:
    """Channels, users and per-episode messages in one SQLite database.

    Args:
        path: SQLite database path; ``":memory:"`` (default) keeps everything in this process.
        max_episodes: Episodes whose posts are retained (least recently used are dropped first).
    """

    def __init__(self, path: str = ":memory:", *, max_episodes: int = 4096) -> None:
        if max_episodes < 1:
            raise ValueError("max_episodes must be >= 1")
        self._lock = threading.Lock()
        self._max_episodes = max_episodes
        self._clock = 0
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.executescript(_SCHEMA)
        with self._lock:
            self._seed()

    def _seed(self) -> None:
        db = self._db
        db.execute("BEGIN")
        db.executemany("INSERT INTO channels VALUES (?, ?, ?)", SEED_CHANNELS)
        db.executemany("INSERT INTO users VALUES (?, ?, ?)", SEED_USERS)
        db.executemany(
            "INSERT INTO messages (episode, channel, user, ts, text) VALUES (?, ?, ?, ?, ?)",
            [(_SEED, ch, user, SEED_EPOCH + offset, text) for ch, user, offset, text in SEED_MESSAGES],
        )
        db.execute("COMMIT")

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    def _channel(self, channel: str) -> str:
        name = channel.strip().lstrip("#").lower()
        row = self._db.execute("SELECT name FROM channels WHERE name = ?", (name,)).fetchone()
        if row is None:
            known = ", ".join(f"#{c[0]}" for c in SEED_CHANNELS)
            raise WorkspaceError(f"Unknown channel '#{name}'. Channels: {known}")
        return name

    def _touch(self, episode: str) -> int:
        """Mark ``episode`` used; return its post count. Evicts the least recently used beyond the cap."""
        self._clock += 1
        row = self._db.execute("SELECT posts FROM episodes WHERE episode = ?", (episode,)).fetchone()
        if row is None:
            self._db.execute("INSERT INTO episodes VALUES (?, ?, 0)", (episode, self._clock))
            self._evict()
            return 0
        self._db.execute("UPDATE episodes SET last_used = ? WHERE episode = ?", (self._clock, episode))
        return int(row[0])

    def _evict(self) -> None:
        (count,) = self._db.execute("SELECT COUNT(*) FROM episodes").fetchone()
        excess = int(count) - self._max_episodes
        if excess <= 0:
            return
        old = [
            r[0]
            for r in self._db.execute("SELECT episode FROM episodes ORDER BY last_used LIMIT ?", (excess,))
        ]
        self._db.executemany("DELETE FROM messages WHERE episode = ?", [(e,) for e in old])
        self._db.executemany("DELETE FROM episodes WHERE episode = ?", [(e,) for e in old])

    @staticmethod
    def _episode(episode: str) -> str:
        return episode or "default"

    def list_channels(self) -> list[dict[str, Any]]:
        """Every channel with its topic and member count."""
        with self._lock:
            rows = self._db.execute("SELECT name, topic, members FROM channels ORDER BY name").fetchall()
        return [{"name": n, "topic": t, "members": m} for n, t, m in rows]

    def list_users(self) -> list[dict[str, Any]]:
        """Every user with real name and title."""
        with self._lock:
            rows = self._db.execute("SELECT name, real_name, title FROM users ORDER BY name").fetchall()
        return [{"name": n, "real_name": r, "title": t} for n, r, t in rows]

    def post(self, episode: str, channel: str, text: str) -> dict[str, Any]:
        """Post ``text`` to ``channel`` as the agent within ``episode``."""
        episode = self._episode(episode)
        body = text.strip()
        if not body:
            raise WorkspaceError("text must not be empty")
        if len(body) > MAX_MESSAGE_CHARS:
            raise WorkspaceError(f"text too long (limit {MAX_MESSAGE_CHARS} characters)")
        with self._lock:
            name = self._channel(channel)
            self._db.execute("BEGIN")
            posts = self._touch(episode)
            ts = SEED_EPOCH + 86_400 + posts + 1
            self._db.execute(
                "INSERT INTO messages (episode, channel, user, ts, text) VALUES (?, ?, ?, ?, ?)",
                (episode, name, AGENT_USER, ts, body),
            )
            self._db.execute("UPDATE episodes SET posts = posts + 1 WHERE episode = ?", (episode,))
            self._db.execute("COMMIT")
        return {"ok": True, "channel": name}

    def read(self, episode: str, channel: str, limit: int = 20) -> dict[str, Any]:
        """The last ``limit`` messages of ``channel`` visible to ``episode``, oldest first."""
        episode = self._episode(episode)
        if not 1 <= limit <= 100:
            raise WorkspaceError("limit must be between 1 and 100")
        with self._lock:
            name = self._channel(channel)
            rows = self._db.execute(
                "SELECT user, ts, text FROM messages WHERE channel = ? AND episode IN (?, ?) "
                "ORDER BY ts DESC, id DESC LIMIT ?",
                (name, _SEED, episode, limit),
            ).fetchall()
        messages = [{"user": u, "text": t} for u, _, t in reversed(rows)]
        return {"channel": name, "messages": messages}

    def search(self, episode: str, query: str, limit: int = 20) -> dict[str, Any]:
        """Messages visible to ``episode`` containing every word of ``query`` (case-insensitive)."""
        episode = self._episode(episode)
        words = [w for w in query.lower().split() if w]
        if not words:
            raise WorkspaceError("query must not be empty")
        clause = " AND ".join("instr(lower(text), ?) > 0" for _ in words)
        with self._lock:
            rows = self._db.execute(
                f"SELECT channel, user, ts, text FROM messages WHERE episode IN (?, ?) AND {clause} "
                "ORDER BY ts DESC, id DESC LIMIT ?",
                (_SEED, episode, *words, limit),
            ).fetchall()
        return {"matches": [{"channel": c, "user": u, "text": t} for c, u, _, t in rows]}
