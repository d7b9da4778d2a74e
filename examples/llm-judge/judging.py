"""The checker of the judged_quote tasks: an LLM judge on any OpenAI-compatible endpoint.

Point it at a server with environment variables (the defaults suit `vllm serve Qwen/Qwen3-8B` on this machine):
JUDGE_BASE_URL (http://localhost:8000/v1), JUDGE_MODEL (Qwen/Qwen3-8B) and, for a hosted API, JUDGE_API_KEY_ENV
naming the variable that holds the key (OPENAI_API_KEY, say); JUDGE_CACHE, a JSONL file that keeps verdicts
across runs.
"""

import os
from pathlib import Path

from mcprl_env.judge import Judge

judge = Judge(
    base_url=os.environ.get("JUDGE_BASE_URL", "http://localhost:8000/v1"),
    model=os.environ.get("JUDGE_MODEL", "Qwen/Qwen3-8B"),
    rubric=Path(__file__).with_name("rubric.md"),
    api_key_env=os.environ.get("JUDGE_API_KEY_ENV") or None,
    max_concurrency=8,
    timeout_s=60,
    max_retries=3,
    cache_path=os.environ.get("JUDGE_CACHE") or None,
)
