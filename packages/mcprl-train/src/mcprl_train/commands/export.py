"""``mcprl-train export``: a checkpoint as a Hugging Face model directory, as users ship models.

The directory holds what ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` and
``vllm serve`` read: the weights (full, or the LoRA adapter merged into its base with peft's
``merge_and_unload``), ``config.json``, the tokenizer with its chat template, ``generation_config.json`` and a
model card (``README.md``, `mcprl_train.commands.model_card`). ``adapter=True`` also writes the adapter alone
under ``adapter/`` (for ``vllm serve BASE --enable-lora`` or ``PeftModel.from_pretrained``). The value head
is a training device and is not exported.

Everything is written into a temporary sibling directory and renamed into place at the end, so a failure at
any point leaves no half-written output.

Example::

    exported = export_checkpoint(Path("outputs/run/checkpoints/step-00000050"), Path("my-agent"))
    push_export(exported.path, "me/my-agent")           # needs a token (`hf auth login` or HF_TOKEN)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import structlog

from mcprl_train.errors import ExportError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from mcprl_policy import DType
    from mcprl_train.config import Config
    from mcprl_train.run.checkpoint import Checkpoint
    from mcprl_train.run.run_dir import RunDir

__all__ = ["Exported", "export_checkpoint", "hub_token", "locate_checkpoint", "push_export"]

logger = structlog.get_logger()

ADAPTER_DIR = "adapter"
TRAIN_CONFIG = "mcprl_train_config.yaml"


@attrs.frozen(kw_only=True)
class Exported:
    """What `export_checkpoint` wrote.

    Attributes:
        path: The exported model directory.
        checkpoint: The checkpoint it came from.
        step: The checkpoint's training step.
        merged_lora: Whether a LoRA adapter was merged into its base (False: full weights).
        adapter: The adapter-only directory (``--adapter``), or None.
        parser_family: mcprl's tool-call parser family of the model's chat template.
        vllm_tool_parser: vLLM's ``--tool-call-parser`` for that family (None when vLLM has none we know).
        skipped: Newer checkpoints that failed verification (name → reason) when a run directory was given.
    """

    path: Path
    checkpoint: Path
    step: int
    merged_lora: bool
    adapter: Path | None
    parser_family: str
    vllm_tool_parser: str | None
    skipped: dict[str, str] = attrs.field(factory=dict[str, str])


def locate_checkpoint(path: Path) -> tuple[RunDir, Checkpoint]:
    """`mcprl_train.run.run_dir.open_checkpoint`, its errors as `ExportError`.

    Raises:
        ExportError: ``path`` is missing, neither a checkpoint nor a run directory, or fails verification
            (the message names the file).
    """
    from mcprl_train.errors import CheckpointError, RunDirError
    from mcprl_train.run.run_dir import open_checkpoint

    try:
        return open_checkpoint(path)
    except RunDirError as exc:
        raise ExportError(str(exc)) from exc
    except CheckpointError as exc:
        raise ExportError(f"{path}: {exc}") from exc


def export_checkpoint(
    source: Path,
    output: Path,
    *,
    adapter: bool = False,
    force: bool = False,
    dtype: DType | None = None,
    model_ref: str | None = None,
) -> Exported:
    """Write the policy of the checkpoint at ``source`` as a Hugging Face model directory at ``output``.

    Args:
        source: A checkpoint directory (``<run>/checkpoints/step-N``) or a run directory (its latest one).
        output: The directory to create.
        adapter: Also write the LoRA adapter alone under ``output/adapter/`` (LoRA checkpoints only).
        force: Replace an existing non-empty ``output``.
        dtype: The exported weights' dtype (default: the run's ``model.dtype``).
        model_ref: How the model card's serving commands name the model (a hub repository id); default
            ``output``.

    Raises:
        ExportError: a missing or corrupt checkpoint, an existing non-empty ``output`` without ``force``, an
            ``output`` that overlaps the checkpoint, ``adapter`` for a full fine-tune.
    """
    run_dir, checkpoint = locate_checkpoint(source)
    _check_output(output, checkpoint.path, force=force)
    config = run_dir.load_config()
    policy_dir = checkpoint.subdir("policy")
    meta = _policy_meta(policy_dir)
    lora = meta.get("lora") is not None
    if adapter and not lora:
        raise ExportError(f"--adapter: {policy_dir} holds full weights, not a LoRA adapter")
    tmp = output.parent / f".{output.name}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp.mkdir()
    try:
        exported = _write_export(
            tmp,
            output,
            model_ref=model_ref,
            config=config,
            run_dir=run_dir,
            checkpoint=checkpoint,
            meta=meta,
            adapter=adapter,
            dtype=dtype or config.model.dtype,
        )
        _move_into_place(tmp, output)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("checkpoint_exported", checkpoint=str(checkpoint.path), path=str(output), lora=lora)
    return attrs.evolve(exported, skipped=checkpoint.skipped)


def _check_output(output: Path, checkpoint: Path, *, force: bool) -> None:
    out, ckpt = output.resolve(), checkpoint.resolve()
    if out == ckpt or out in ckpt.parents or ckpt in out.parents:
        raise ExportError(f"{output}: the output directory overlaps the checkpoint {checkpoint}")
    if output.is_file() or output.is_symlink():
        raise ExportError(f"{output}: exists and is not a directory")
    if output.is_dir() and any(output.iterdir()) and not force:
        raise ExportError(f"{output}: exists and is not empty (--force replaces it)")


def _policy_meta(policy_dir: Path) -> dict[str, Any]:
    from mcprl_policy.policy import POLICY_META_FILE

    path = policy_dir / POLICY_META_FILE
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ExportError(f"{path}: missing; the checkpoint's policy was not saved by mcprl") from exc
    except json.JSONDecodeError as exc:
        raise ExportError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(meta, dict) or "base_model" not in meta:
        raise ExportError(f"{path}: no 'base_model' entry; the checkpoint's policy was not saved by mcprl")
    return dict(meta)  # pyright: ignore[reportUnknownArgumentType]


def _write_export(
    out: Path,
    final: Path,
    *,
    model_ref: str | None,
    config: Config,
    run_dir: RunDir,
    checkpoint: Checkpoint,
    meta: dict[str, Any],
    adapter: bool,
    dtype: DType,
) -> Exported:
    from mcprl_policy.loading import load_tokenizer
    from mcprl_train.commands.model_card import (
        render_model_card,
        tool_call_format,
        vllm_tool_parser,
    )

    policy_dir = checkpoint.subdir("policy")
    tokenizer = load_tokenizer(str(policy_dir))
    merged = meta.get("lora") is not None
    model: Any
    if merged:
        model = _merged_model(
            policy_dir, meta, config, dtype=dtype, adapter_dir=out / ADAPTER_DIR if adapter else None
        )
    else:
        from mcprl_policy.loading import load_model

        model = load_model(str(policy_dir), dtype=dtype, device="cpu")
    model.generation_config = _generation_config(model, tokenizer, config)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    family, example = tool_call_format(tokenizer, config)
    exported = Exported(
        path=final,
        checkpoint=checkpoint.path,
        step=checkpoint.step,
        merged_lora=merged,
        adapter=final / ADAPTER_DIR if adapter else None,
        parser_family=family,
        vllm_tool_parser=vllm_tool_parser(family),
    )
    card = render_model_card(
        exported,
        config=config,
        run_dir=run_dir,
        base_model=str(meta["base_model"]),
        call_example=example,
        model_ref=model_ref,
    )
    (out / "README.md").write_text(card)
    shutil.copyfile(run_dir.config_path, out / TRAIN_CONFIG)
    return exported


def _merged_model(
    policy_dir: Path, meta: dict[str, Any], config: Config, *, dtype: DType, adapter_dir: Path | None
) -> PreTrainedModel:
    """The base in ``dtype`` (never 4-bit: merging into NF4 weights would round the update away) + the
    adapter, merged (`peft.LoraModel.merge_and_unload`: W ← W + (α/r)·B·A per adapted layer)."""
    from peft import PeftModel

    from mcprl_policy.loading import load_model, resolve_model_path

    base_name = str(meta["base_model"])
    if Path(base_name).is_absolute() and not Path(base_name).exists():
        # An embedded model's cache directory (rebuilt byte for byte from its name) or a moved base.
        logger.warning("export_base_missing", base_model=base_name, using=config.model.name)
        base_name = config.model.name
    base = load_model(resolve_model_path(base_name), dtype=dtype, device="cpu")
    peft_model: Any = PeftModel.from_pretrained(base, str(policy_dir))  # pyright: ignore[reportUnknownMemberType]
    if adapter_dir is not None:
        peft_model.save_pretrained(str(adapter_dir), safe_serialization=True)
    merged: PreTrainedModel = peft_model.merge_and_unload()
    return merged


def _generation_config(model: PreTrainedModel, tokenizer: Any, config: Config) -> Any:
    """Defaults that reproduce the run's evaluation: greedy (or its sampling settings), the end-of-turn token
    as EOS, one turn's token budget."""
    from transformers import GenerationConfig

    eos: list[int] = []
    candidates: list[object] = [model.config.eos_token_id, tokenizer.eos_token_id]
    for token_id in candidates:
        ids: list[object] = list(token_id) if isinstance(token_id, list) else [token_id]  # pyright: ignore[reportUnknownArgumentType]
        eos.extend(i for i in ids if isinstance(i, int) and i not in eos)
    kwargs: dict[str, Any] = {
        "eos_token_id": eos if len(eos) > 1 else eos[0] if eos else None,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": model.config.bos_token_id,
        "max_new_tokens": config.env.max_new_tokens_per_turn,
    }
    sampling = config.sampling
    if config.eval.greedy or sampling.greedy:
        kwargs["do_sample"] = False
    else:
        kwargs |= {
            "do_sample": True,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "repetition_penalty": sampling.repetition_penalty,
        }
    return GenerationConfig(**kwargs)


def _move_into_place(tmp: Path, output: Path) -> None:
    from mcprl_train.run.checkpoint import fsync_dir

    trash: Path | None = None
    if output.exists():
        trash = output.parent / f".{output.name}.old-{os.getpid()}-{time.monotonic_ns()}"
        os.rename(output, trash)
    try:
        os.rename(tmp, output)
    except OSError:
        if trash is not None:
            os.rename(trash, output)
        raise
    fsync_dir(output.parent)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def hub_token(repo_id: str) -> str:
    """The token a push to ``repo_id`` uses, checked before anything is exported.

    Raises:
        ExportError: ``repo_id`` is not ``owner/name``, the hub is switched off (``HF_HUB_OFFLINE``), or no
            token is configured.
    """
    from huggingface_hub import constants, get_token

    if not _REPO_ID.match(repo_id) or "--" in repo_id or ".." in repo_id:
        raise ExportError(f"--push-to-hub {repo_id!r}: expected a repository id 'owner/name'")
    if constants.HF_HUB_OFFLINE:
        raise ExportError(
            f"--push-to-hub {repo_id}: HF_HUB_OFFLINE is set, so the hub cannot be reached; unset it, or export "
            f"without --push-to-hub and upload later with `hf upload {repo_id} DIR`"
        )
    token = get_token()
    if token is None:
        raise ExportError(
            f"--push-to-hub {repo_id}: no Hugging Face token; run `hf auth login` or set HF_TOKEN"
        )
    return token


def push_export(directory: Path, repo_id: str, *, token: str, private: bool = False) -> str:
    """Upload an exported directory to the hub model repository ``repo_id`` (created if missing).

    Returns:
        The URL of the upload's commit.

    Raises:
        ExportError: the hub refused or could not be reached; the local export stays complete.
    """
    from huggingface_hub import HfApi

    # The hub re-exports its HTTP transport's base error (refusals and unreachable hosts alike).
    from huggingface_hub.errors import HTTPError  # pyright: ignore[reportPrivateImportUsage]

    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        commit: Any = api.upload_folder(
            repo_id=repo_id,
            folder_path=directory,
            repo_type="model",
            commit_message=f"mcprl-train export of {directory.name}",
        )
    except (HTTPError, OSError) as exc:  # HTTPError: the hub's transport, refusals included
        raise ExportError(
            f"exported {directory}, but the upload to {repo_id} failed: {exc}; retry with "
            f"`hf upload {repo_id} {directory}`"
        ) from exc
    return str(commit.commit_url)
