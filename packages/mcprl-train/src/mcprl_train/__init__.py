"""The training app: profiles, GRPO loop, checkpoints, tracking."""

__all__: list[str] = []
