"""Policy with a value head: HF and vLLM samplers, LoRA, 4-bit, reference policy."""

__all__: list[str] = []
