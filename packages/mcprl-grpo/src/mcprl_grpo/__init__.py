"""GRPO math on torch alone: advantages, ratios, losses, KL."""

__all__: list[str] = []
