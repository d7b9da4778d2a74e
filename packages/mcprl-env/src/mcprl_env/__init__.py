"""Multi-turn environment: tasks, tool-call parsing, episodes, reward shaping."""

__all__: list[str] = []
