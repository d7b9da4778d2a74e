"""Task sets and deterministic task generators for the offline servers."""

__all__: list[str] = []
