"""Is ``model.name`` usable by the pipeline? Its tokenizer, chat template and vocabulary, checked without weights.

The same checks run at the start of ``mcprl-train train`` (the first failure stops the run before its
directory is written: `require_model_ready`) and as rows of ``mcprl-train doctor`` (`check_model`):

1. tokenizer — ``model.name``'s tokenizer loads and has a chat template;
2. template — the template shows the tools' definitions to the model and renders a sample conversation with
   tools: a user turn, an assistant tool call, the tool's result and a final answer
   (``env.chat_template_kwargs`` applied);
3. parser — the tool-call format: ``env.parser=auto`` recognises the family from what the template renders
   (`mcprl_env.detect_parser_family`); a named family must read back the call the template rendered;
4. vocabulary — the model's embedding (``vocab_size`` in its config) has a row for every id the tokenizer
   can produce (`mcprl_policy.vocab.decodable_ids`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import attrs

from mcprl_train.errors import ConfigError

if TYPE_CHECKING:
    from mcprl_env.protocols import ChatTokenizer
    from mcprl_train.config import Config

__all__ = ["CheckResult", "check_model", "require_model_ready"]


@attrs.frozen(kw_only=True)
class CheckResult:
    """One check: of the model here, of any part of the setup in ``mcprl-train doctor``.

    Attributes:
        category: installation, devices, keys, servers, tasks or model.
        name: What was checked (of the model: tokenizer, template, parser, vocabulary).
        ok: Whether it passed.
        detail: What was found.
        fix: What to do about a failure (empty when ok).
    """

    category: str = "model"
    name: str
    ok: bool
    detail: str
    fix: str = ""


def check_model(config: Config) -> list[CheckResult]:
    """Every check of `config.model.name`, in order; a failed tokenizer check ends the list (nothing to render)."""
    from mcprl_policy import ModelLoadError
    from mcprl_policy.loading import load_tokenizer, resolve_model_path

    name = config.model.name
    try:
        path = resolve_model_path(name)
        tokenizer: Any = load_tokenizer(path)
    except ModelLoadError as exc:
        return [
            CheckResult(
                name="tokenizer",
                ok=False,
                detail=str(exc),
                fix="set model.name to a local model directory or a hub id in the local cache",
            )
        ]
    if not tokenizer.chat_template:
        return [
            CheckResult(
                name="tokenizer",
                ok=False,
                detail=f"model.name={name!r} has no chat template",
                fix="use the model's instruct/chat release, or add its template as chat_template.jinja",
            )
        ]
    checks = [
        CheckResult(name="tokenizer", ok=True, detail=f"{type(tokenizer).__name__}, {len(tokenizer)} ids")
    ]
    checks.append(_template(config, tokenizer))
    checks.append(_parser(config, tokenizer))
    checks.append(_vocabulary(path, tokenizer))
    return checks


def require_model_ready(config: Config) -> None:
    """Raise on the first failed `check_model` check.

    Raises:
        ConfigError: the first failure's finding and fix, in one line.
    """
    for check in check_model(config):
        if not check.ok:
            raise ConfigError(f"model.name={config.model.name!r}: {check.detail}; {check.fix}")


def _sample_conversation() -> list[dict[str, Any]]:
    from mcprl_env.parsing import PROBE_CALL

    call = {
        "type": "function",
        "function": {"name": PROBE_CALL.name, "arguments": dict(PROBE_CALL.arguments)},
    }
    return [
        {"role": "user", "content": "What is the weather in Paris for 3 days?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": PROBE_CALL.name, "content": "sunny, 21 C"},
        {"role": "assistant", "content": "Sunny, 21 C."},
    ]


def _template(config: Config, tokenizer: ChatTokenizer) -> CheckResult:
    from mcprl_env.parsing import PROBE_CALL, PROBE_TOOL

    kwargs = config.env.chat_template_kwargs
    conversation = _sample_conversation()
    try:
        prompt = tokenizer.apply_chat_template(
            conversation[:1], tools=[PROBE_TOOL], add_generation_prompt=True, tokenize=False, **kwargs
        )
        text = tokenizer.apply_chat_template(conversation, tools=[PROBE_TOOL], tokenize=False, **kwargs)
    except Exception as exc:
        # The template is the vendor's code: whatever it raises means it cannot render this conversation.
        return CheckResult(
            name="template",
            ok=False,
            detail=f"the chat template cannot render a conversation with tools ({type(exc).__name__}: {exc})",
            fix="use a chat template with tool support (the model's instruct release) or fix "
            "env.chat_template_kwargs",
        )
    if PROBE_CALL.name not in str(prompt):
        return CheckResult(
            name="template",
            ok=False,
            detail="the chat template has no tool support: it does not show the tools' definitions to the model",
            fix="use the chat template of a release with tool calling (e.g. an -Instruct model's), saved as "
            "chat_template.jinja next to the tokenizer",
        )
    return CheckResult(
        name="template", ok=True, detail=f"a tool conversation renders ({len(str(text))} chars)"
    )


def _parser(config: Config, tokenizer: ChatTokenizer) -> CheckResult:
    from mcprl_env.errors import UnknownToolCallFormatError
    from mcprl_env.parsing import AUTO, PROBE_CALL, PROBE_TOOL, detect_parser_family, get_parser
    from mcprl_env.parsing import render_probe_turn as render

    kwargs = config.env.chat_template_kwargs
    family = config.env.parser
    try:
        if family.lower() == AUTO:
            found = detect_parser_family(tokenizer, template_kwargs=kwargs)
            return CheckResult(name="parser", ok=True, detail=f"env.parser=auto: recognised {found!r}")
        turn = render(tokenizer, template_kwargs=kwargs)
    except UnknownToolCallFormatError as exc:
        return CheckResult(
            name="parser",
            ok=False,
            detail=str(exc).partition("; ")[0],
            fix=str(exc).partition("; ")[2] or "set env.parser",
        )
    parsed = get_parser(family).parse(turn, tools=[PROBE_TOOL])
    if parsed.errors or parsed.calls != [PROBE_CALL]:
        return CheckResult(
            name="parser",
            ok=False,
            detail=f"env.parser={family} does not read the tool call this template renders ({turn[:200]!r})",
            fix="set env.parser=auto (recognised from the template) or the family whose format this is",
        )
    return CheckResult(name="parser", ok=True, detail=f"env.parser={family} reads the template's tool call")


def _embedding_rows(path: str) -> int | None:
    """``vocab_size`` of the model's (text) config: a saved LoRA adapter's base model for an adapter directory."""
    from mcprl_policy.policy import POLICY_META_FILE

    meta = Path(path) / POLICY_META_FILE
    if meta.is_file():
        saved = json.loads(meta.read_text())
        if saved.get("lora") is not None:
            from mcprl_policy.loading import resolve_model_path

            path = resolve_model_path(saved["base_model"])
    from transformers import AutoConfig, PretrainedConfig

    # transformers leaves AutoConfig.from_pretrained's **kwargs (and so its return type) unannotated.
    model_config: PretrainedConfig = AutoConfig.from_pretrained(path)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    text_config = cast("object", model_config.get_text_config())  # pyright: ignore[reportUnknownMemberType]
    rows = getattr(text_config, "vocab_size", None)
    return int(rows) if rows is not None else None


def _vocabulary(path: str, tokenizer: Any) -> CheckResult:
    from mcprl_policy.vocab import decodable_ids

    ids = decodable_ids(tokenizer)
    try:
        rows = _embedding_rows(path)
    except (OSError, ValueError) as exc:
        return CheckResult(
            name="vocabulary",
            ok=False,
            detail=f"the model's config cannot be read: {exc}",
            fix="the model directory needs its config.json",
        )
    if rows is None:
        return CheckResult(
            name="vocabulary", ok=True, detail=f"{ids} token ids; the config has no vocab_size"
        )
    if ids > rows:
        return CheckResult(
            name="vocabulary",
            ok=False,
            detail=f"the tokenizer has {ids} token ids but the model's embedding has {rows} rows (vocab_size): "
            "model and tokenizer come from different checkpoints",
            fix="use the tokenizer saved with the model, or resize the embedding after adding tokens "
            "(model.resize_token_embeddings(len(tokenizer))) and save both",
        )
    return CheckResult(name="vocabulary", ok=True, detail=f"{ids} token ids <= {rows} embedding rows")
