"""The model card (``README.md``) of an exported checkpoint: what it was trained on, how well it does, how it
writes tool calls, and how to serve it with vLLM and with transformers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import yaml

from mcprl_policy import PINNED_MODELS

if TYPE_CHECKING:
    from mcprl_train.commands.export import Exported
    from mcprl_train.config import Config
    from mcprl_train.run.run_dir import RunDir

__all__ = ["render_model_card", "tool_call_format", "vllm_tool_parser"]

# The validation metrics a card shows (plus `val/family/<name>/success_rate` for each task family).
_CARD_METRICS: Final = (
    "val/success_rate",
    "val/reward_mean",
    "val/turns_mean",
    "val/tool_calls_mean",
    "val/tools/error_rate",
    "val/tools/invalid_call_rate",
    "val/valid_frac",
    "val/episodes",
)
# vLLM's default `--max-lora-rank`; a larger adapter needs the flag.
_VLLM_MAX_LORA_RANK: Final = 16

# mcprl's parser family → vLLM's `--tool-call-parser` (vllm/entrypoints/openai/tool_parsers: `hermes` for
# Hermes 2/3, Qwen2.5 and Qwen3; `qwen3_coder` for Qwen3.5 and Qwen3-Coder's XML calls; `llama3_json` for
# Llama 3.1/3.2/3.3's JSON calls).
_VLLM_TOOL_PARSERS: Final[Mapping[str, str]] = {
    "hermes": "hermes",
    "qwen3_coder": "qwen3_coder",
    "llama3_json": "llama3_json",
}


def vllm_tool_parser(family: str) -> str | None:
    """vLLM's ``--tool-call-parser`` for an mcprl parser family, or None for a family vLLM has no parser for."""
    return _VLLM_TOOL_PARSERS.get(family)


def tool_call_format(tokenizer: Any, config: Config) -> tuple[str, str]:
    """``(family, example)``: the run's parser family (``env.parser``, or recognised from the chat template
    when ``auto``) and one tool call as this model's template renders it.

    Raises:
        mcprl_env.UnknownToolCallFormatError: ``env.parser`` is ``auto`` and no parser reads the template's
            calls (the run could not have started either).
    """
    from mcprl_env.parsing import AUTO, detect_parser_family, get_parser, render_probe_turn
    from mcprl_env.parsing.registry import canonical_families

    kwargs = config.env.chat_template_kwargs
    if config.env.parser.lower() == AUTO:
        family = detect_parser_family(tokenizer, template_kwargs=kwargs)
    else:
        chosen = type(get_parser(config.env.parser))
        family = next(
            (name for name, factory in canonical_families() if type(factory()) is chosen), config.env.parser
        )
    return family, render_probe_turn(tokenizer, template_kwargs=kwargs)


def _final_metrics(run_dir: RunDir, step: int) -> tuple[int | None, dict[str, float]]:
    """The last validation at or before ``step``: ``(its step, its val/* metrics)``."""
    last: Mapping[str, Any] | None = None
    for record in run_dir.read_metrics().records:
        if record.get("kind") == "eval" and int(record.get("step", -1)) <= step:
            last = record
    if last is None:
        return None, {}
    values = {
        k: float(v)
        for k, v in last.items()
        if isinstance(v, int | float)
        and (k in _CARD_METRICS or (k.startswith("val/family/") and k.endswith("/success_rate")))
    }
    return int(last["step"]), values


def _summary(run_dir: RunDir, step: int) -> dict[str, Any]:
    """``summary.json`` when it describes the run up to ``step`` (the final checkpoint), else empty."""
    try:
        summary: object = json.loads(run_dir.summary_path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(summary, dict):
        return {}
    typed: dict[str, Any] = dict(summary)  # pyright: ignore[reportUnknownArgumentType]
    return typed if typed.get("steps") == step else {}


def _hub_base(base_model: str) -> str | None:
    """The hub id the base weights are, if any: a built-in model's (`PINNED_MODELS`), or a name that is no path."""
    if (pinned := PINNED_MODELS.get(base_model)) is not None:
        return pinned.hub_id
    return None if Path(base_model).is_absolute() or Path(base_model).exists() else base_model


def _base_model_cell(base_model: str) -> str:
    pinned = PINNED_MODELS.get(base_model)
    if pinned is None:
        return f"`{base_model}`"
    return f"`{base_model}`: `{pinned.hub_id}`, the GGUF of the `{pinned.requirement}` wheel, dequantised"


def _template_cell(base_model: str) -> str:
    pinned = PINNED_MODELS.get(base_model)
    if pinned is not None and pinned.template_note is not None:
        return f"`chat_template.jinja`: {pinned.template_note}"
    return "`chat_template.jinja`: the one the run rendered its episodes with"


def _front_matter(base_model: str, *, lora: bool) -> str:
    from huggingface_hub import ModelCardData

    hub_base = _hub_base(base_model)
    data = ModelCardData(
        base_model=hub_base,
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=["mcprl", "grpo", "tool-use", "mcp", *(["lora"] if lora else [])],
    )
    return f"---\n{data.to_yaml()}\n---\n"  # pyright: ignore[reportUnknownMemberType]


def _training_table(exported: Exported, config: Config, base_model: str, run_dir: RunDir) -> str:
    lora = config.lora
    weights = (
        f"LoRA (r={lora.r}, α={lora.alpha:g}) merged into the base"
        if exported.merged_lora and lora is not None
        else "full fine-tune"
    )
    sft = f"{config.sft.steps} SFT steps on demonstrations, then " if config.sft.enabled else ""
    rows = [
        ("base model", _base_model_cell(base_model)),
        ("chat template", _template_cell(base_model)),
        ("weights", weights),
        ("checkpoint", f"`{exported.checkpoint.name}` of run `{run_dir.path.name}` (step {exported.step})"),
        (
            "training",
            f"{sft}GRPO ({config.grpo.estimator}), {config.grpo.group_size} episodes per task, "
            f"{config.grpo.tasks_per_step} tasks per step, lr {config.optim.lr:g}",
        ),
        ("training tasks", f"`{config.tasks.train}`"),
        ("validation tasks", f"`{config.tasks.validation}`"),
        (
            "turns / tokens per turn",
            f"{dict(config.env.max_turns_by_difficulty)} / {config.env.max_new_tokens_per_turn}",
        ),
    ]
    lines = ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]
    tools = yaml.safe_dump(config.to_dict()["tools"], sort_keys=True).strip()
    return "\n".join(lines) + f"\n\nMCP servers (`tools` of the run's config):\n\n```yaml\n{tools}\n```\n"


def _metrics_section(exported: Exported, config: Config, run_dir: RunDir) -> str:
    at, metrics = _final_metrics(run_dir, exported.step)
    summary = _summary(run_dir, exported.step)
    if not metrics:
        return "No validation was recorded up to this checkpoint.\n"
    decoding = "greedy" if config.eval.greedy else f"temperature {config.sampling.temperature:g}"
    lines = [
        f"Validation at step {at} ({decoding}, one episode per task, `metrics.jsonl` of the run):",
        "",
        "| metric | value |",
        "|---|---|",
        *(f"| `{k}` | {metrics[k]:.4g} |" for k in sorted(metrics, key=_metric_order)),
    ]
    keep = ("success_init", "success_warm_start", "success_final", "success_last3_mean", "elapsed_s")
    run = {k: summary[k] for k in keep if summary.get(k) is not None}
    if run:
        lines += ["", "Run summary (`summary.json`): " + ", ".join(f"{k} {v:.4g}" for k, v in run.items())]
    return "\n".join(lines) + "\n"


def _metric_order(key: str) -> tuple[int, str]:
    return (_CARD_METRICS.index(key), key) if key in _CARD_METRICS else (len(_CARD_METRICS), key)


def _serving_section(exported: Exported, config: Config, model_ref: str, base_model: str) -> str:
    parser = exported.vllm_tool_parser
    if parser is None:
        vllm = (
            f"vLLM has no tool-call parser known to mcprl for the `{exported.parser_family}` format: serve it "
            f"with `vllm serve {model_ref}` and parse calls with mcprl's parser, or register a vLLM tool parser.\n"
        )
    else:
        vllm = f"```bash\nvllm serve {model_ref} --enable-auto-tool-choice --tool-call-parser {parser}\n```\n"
        if exported.adapter is not None:
            rank = config.lora.r if config.lora is not None else 0
            max_rank = f" --max-lora-rank {rank}" if rank > _VLLM_MAX_LORA_RANK else ""
            name = exported.adapter.name
            # --lora-modules takes a local directory: a hub repository is downloaded first.
            adapter_path = (
                f"{model_ref}/{name}"
                if model_ref == str(exported.path)
                else f"$(hf download {model_ref} --include '{name}/*')/{name}"
            )
            vllm += (
                "\nOr the base with the adapter alone (`adapter/`), hot-swappable:\n\n```bash\n"
                f"vllm serve {base_model} --enable-lora{max_rank} --lora-modules "
                f"mcprl={adapter_path} --enable-auto-tool-choice --tool-call-parser {parser}"
                "\n```\n"
            )
    kwargs = dict(config.env.chat_template_kwargs)
    template_note = (
        f"\nThe run rendered its chat template with `{json.dumps(kwargs)}`: pass the same as "
        "`chat_template_kwargs` (vLLM's request field, or keyword arguments of `apply_chat_template`).\n"
        if kwargs
        else ""
    )
    call_kwargs = "".join(f", {k}={v!r}" for k, v in kwargs.items())
    transformers = f"""```python
from transformers import AutoModelForCausalLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{model_ref}")
model = AutoModelForCausalLM.from_pretrained("{model_ref}")
messages = [{{"role": "user", "content": "What is the price of AAPL?"}}]
tools = [...]  # the MCP servers' tool schemas, in the OpenAI function format
inputs = tokenizer.apply_chat_template(
    messages, tools=tools, add_generation_prompt=True, return_tensors="pt", return_dict=True{call_kwargs}
)
out = model.generate(**inputs)  # generation_config.json: the run's evaluation decoding
print(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
```
"""
    return f"### vLLM\n\n{vllm}{template_note}\n### transformers\n\n{transformers}"


def render_model_card(
    exported: Exported,
    *,
    config: Config,
    run_dir: RunDir,
    base_model: str,
    call_example: str,
    model_ref: str | None = None,
) -> str:
    """The card's Markdown, YAML front matter first (base model, library, tags).

    Args:
        exported: What was exported (its path names the model in the serving commands unless ``model_ref``).
        config: The run's resolved config.
        run_dir: The run (metrics, summary).
        base_model: The base model's name or directory.
        call_example: One tool call as the model's template renders it (`tool_call_format`).
        model_ref: How users refer to the model (a hub repository id); default the export directory.
    """
    ref = model_ref or str(exported.path)
    parser = exported.vllm_tool_parser or "none known"
    return (
        _front_matter(base_model, lora=exported.merged_lora)
        + f"\n# {Path(ref).name}\n\n"
        + "A tool-using agent trained with mcprl: GRPO on multi-turn episodes "
        + "against real MCP servers. The training config is `mcprl_train_config.yaml`.\n\n"
        + "## Training\n\n"
        + _training_table(exported, config, base_model, run_dir)
        + "\n## Evaluation\n\n"
        + _metrics_section(exported, config, run_dir)
        + "\n## Tool calls\n\n"
        + f"Format: `{exported.parser_family}` (mcprl's `env.parser`; vLLM `--tool-call-parser {parser}`). "
        + "A call of a tool `mcprl_probe(city, days)`, as this model's chat template renders it:\n\n"
        + f"```text\n{call_example.strip()}\n```\n"
        + "\n## Serving\n\n"
        + _serving_section(exported, config, ref, base_model)
    )
