"""The vendors' published chat templates, fetched once by scripts/fetch-chat-templates.py, on a tiny tokenizer.

Rendering is what these tests are about: the tokenizer is a byte-level BPE trained in memory with the special
tokens of every family covered (so ``skip_special_tokens`` strips them as the model's own tokenizer would); its
``chat_template`` is the vendor's file, rendered by transformers' ``apply_chat_template``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

FETCH_SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "fetch-chat-templates.py"

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
]

# template file → the family auto-detection must find (every template covered by round-trip tests).
TEMPLATE_FAMILIES: dict[str, str] = {
    "Qwen-Qwen3-0.6B.jinja": "hermes",
    "Qwen-Qwen2.5-7B-Instruct.jinja": "hermes",
    "Qwen-QwQ-32B.jinja": "hermes",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "hermes",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": "hermes",
    "Qwen3.5-4B.jinja": "qwen3_coder",
    "Qwen3-Coder.jinja": "qwen3_coder",
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3_json",
    "meta-llama-Llama-3.2-3B-Instruct.jinja": "llama3_json",
    "meta-llama-Llama-3.3-70B-Instruct.jinja": "llama3_json",
}

# Templates that render one call per assistant message at most (they raise on more).
SINGLE_CALL = {
    "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "meta-llama-Llama-3.2-3B-Instruct.jinja",
    "meta-llama-Llama-3.3-70B-Instruct.jinja",
}


def fetch_templates() -> tuple[Path | None, str]:
    """``(directory, "")`` once the templates are cached, else ``(None, why not)``."""
    if os.environ.get("MCPRL_NO_CHAT_TEMPLATES"):
        return None, "MCPRL_NO_CHAT_TEMPLATES is set"
    if not FETCH_SCRIPT.is_file():
        return None, f"{FETCH_SCRIPT} is not there (tests run outside the repository)"
    try:
        done = subprocess.run(
            [sys.executable, str(FETCH_SCRIPT)], capture_output=True, text=True, timeout=900, check=False
        )
    except subprocess.TimeoutExpired:
        return None, "scripts/fetch-chat-templates.py took over 900 s"
    if done.returncode != 0:
        return None, f"scripts/fetch-chat-templates.py failed: {done.stderr.strip()[-500:]}"
    return Path(done.stdout.strip()), ""


@cache
def _base_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tk.train_from_iterator(['<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'] * 10, trainer)
    return tk


def tokenizer_with_template(template: str, eos: str = "<|im_end|>") -> Any:
    """A transformers tokenizer whose chat template is ``template`` and whose end-of-turn token is ``eos``."""
    import transformers

    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=_base_tokenizer(),
        bos_token="<|begin_of_text|>",
        eos_token=eos,
        pad_token="<|endoftext|>",
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in ("<|begin_of_text|>", eos)],
    )
    tok.chat_template = template
    return tok
