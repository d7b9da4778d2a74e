"""The warm start: supervised fine-tuning on demonstrations, loss on assistant tokens only.

A tiny random model cannot discover the tool-call format by RL alone, so a run first imitates a small, fixed
set of (imperfect) demonstrations. Demonstrations are rendered with the same chat template and tool schemas
the environment uses, so the tokens the model imitates are the tokens it will later sample.
"""

from __future__ import annotations

import itertools
import math
import random
import re
import time
from collections.abc import Collection, Sequence
from typing import Any, assert_never

import attrs
import jinja2
import structlog
import torch

from mcprl_env import ChatTokenizer, Environment
from mcprl_policy import Policy
from mcprl_policy.attention import check_packable, is_packable, uses_varlen
from mcprl_policy.prefix_grouped import check_prefix_groupable, pack_prefix_groups
from mcprl_policy.supervised import SupervisedLayout, target_logprobs
from mcprl_policy.vocab import end_of_turn_ids
from mcprl_train.config import Config, OptimConfig, SFTConfig
from mcprl_train.config.sections import SFTLayout
from mcprl_train.errors import DemonstrationError
from mcprl_train.loop.chat_mask import prefix_diff_targets
from mcprl_train.loop.demo_file import Demonstration
from mcprl_train.loop.learner import lr_schedule
from mcprl_train.loop.samples import pack_indices
from mcprl_train.loop.task_stream import IndexedTasks
from mcprl_train.typed_torch import optimizer_step

logger = structlog.get_logger()


@attrs.frozen(kw_only=True)
class SFTExample:
    """One rendered demonstration: token ids and a mask that is 1 on assistant tokens."""

    token_ids: list[int]
    assistant_mask: list[int]

    @property
    def num_targets(self) -> int:
        return sum(self.assistant_mask[1:])

    @property
    def targets(self) -> list[bool]:
        """Per token: whether it is trained on (an assistant token with a prefix: never the first)."""
        return [False, *(bool(m) for m in self.assistant_mask[1:])]

    @property
    def turn_lengths(self) -> list[int]:
        """The number of targets of each assistant turn (each run of consecutive targets), in order."""
        return [sum(1 for _ in run) for flag, run in itertools.groupby(self.targets) if flag]


def render_example(
    tokenizer: ChatTokenizer,
    messages: Sequence[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    template_kwargs: dict[str, Any] | None = None,
    end_of_turn: Collection[int] | None = None,
) -> SFTExample:
    """Render a conversation with the chat template; the mask marks what the model generates.

    A template with ``{% generation %}`` markers says itself which tokens are the assistant's. Any other
    template (Qwen, Llama, Hermes, ...) is rendered prefix by prefix (`prefix_diff_targets`): each assistant
    turn's targets are its text after the generation prompt through its end-of-turn token.

    An assistant message with ``"weight": 0`` (OpenAI's fine-tuning convention) stays in the context but is
    not a target: a demonstration can show a mistake and train only on the recovery from it.

    Args:
        tokenizer: The policy's tokenizer and chat template.
        messages: The conversation (chat messages; assistant tool calls as structured ``tool_calls``).
        tools: Tool schemas the template shows.
        template_kwargs: Extra ``apply_chat_template`` arguments (``EnvConfig.chat_template_kwargs``).
        end_of_turn: Ids that end a sampled turn (default: the tokenizer's eos).

    Raises:
        DemonstrationError: a weight is not 0 or 1, the conversation has no assistant target, the template
            refuses the conversation (raises), or its rendering cannot give one token sequence (see
            `prefix_diff_targets`).
    """
    weights = [_weight(m) for m in messages if m.get("role") == "assistant"]
    clean = [{k: v for k, v in m.items() if k != "weight"} for m in messages]
    kwargs = dict(template_kwargs or {})
    try:
        marked = (
            _generation_mask(tokenizer, clean, tools, kwargs) if _has_generation_markers(tokenizer) else None
        )
        if marked is not None:
            ids, mask = marked
            if 0 in weights:
                mask = _drop_spans(mask, weights)
        else:
            if end_of_turn is None:
                if tokenizer.eos_token_id is None:
                    raise DemonstrationError("the tokenizer has no eos token to end an assistant turn with")
                end_of_turn = {tokenizer.eos_token_id}
            ids, mask = prefix_diff_targets(
                tokenizer,
                clean,
                weights,
                tools=tools or None,
                template_kwargs=kwargs,
                end_of_turn=end_of_turn,
            )
    except jinja2.TemplateError as e:
        # A template refuses what it cannot render (Llama 3.1: one tool call per assistant message).
        raise DemonstrationError(f"the model's chat template refuses it: {e}") from e
    if not any(mask):
        raise DemonstrationError("no assistant tokens to train on (or every assistant message has weight 0)")
    return SFTExample(token_ids=ids, assistant_mask=mask)


def render_demonstrations(
    tokenizer: ChatTokenizer,
    demos: Sequence[Demonstration],
    tasks: IndexedTasks,
    env: Environment,
    *,
    end_of_turn: Collection[int] | None = None,
) -> list[SFTExample]:
    """Render demonstrations with the tool schemas and template arguments the environment uses for each task
    (module docstring); the model's own chat template renders the structured ``tool_calls`` in its format.

    Raises:
        DemonstrationError: naming the demonstration (its source and task id) and the problem: an unknown
            task, a call to a tool the task does not offer, or a rendering problem (`render_example`).
    """
    by_id = {tasks.task_at(i).id: i for i in range(len(tasks))}
    out: list[SFTExample] = []
    for demo in demos:
        where = f"demonstration {demo.source} (task {demo.task_id!r})"
        if demo.task_id not in by_id:
            raise DemonstrationError(f"{where}: no such task in the training set")
        schemas = list(env.tool_access(tasks.task_at(by_id[demo.task_id])).schemas)
        offered = {str(s["function"]["name"]) for s in schemas}
        for name in _called_tools(demo.messages):
            if name not in offered:
                raise DemonstrationError(
                    f"{where}: a tool call names {name!r}, which the task does not offer "
                    f"(its tools: {', '.join(sorted(offered)) or 'none'})"
                )
        try:
            out.append(
                render_example(
                    tokenizer,
                    demo.messages,
                    schemas,
                    template_kwargs=env.config.template_kwargs(),
                    end_of_turn=end_of_turn,
                )
            )
        except DemonstrationError as e:
            raise DemonstrationError(f"{where}: {e}") from e
    return out


def _called_tools(messages: Sequence[dict[str, Any]]) -> list[str]:
    names: list[str] = []
    for m in messages:
        calls: list[dict[str, Any]] = (m.get("tool_calls") or []) if m.get("role") == "assistant" else []
        names.extend(str(call["function"]["name"]) for call in calls)
    return names


_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


def _has_generation_markers(tokenizer: ChatTokenizer) -> bool:
    template: object = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        return bool(_GENERATION_TAG.search(template))
    if isinstance(template, dict):
        return any(isinstance(t, str) and _GENERATION_TAG.search(t) for t in template.values())  # pyright: ignore[reportUnknownVariableType, reportUnknownMemberType]
    return True  # cannot tell: ask for the mask and fall back when it is empty


def _generation_mask(
    tokenizer: ChatTokenizer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    kwargs: dict[str, Any],
) -> tuple[list[int], list[int]] | None:
    """Ids and the template's own assistant mask, or None when it marks nothing."""
    out = tokenizer.apply_chat_template(
        messages,
        tools=tools or None,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
        **kwargs,
    )
    ids = [int(t) for t in out["input_ids"]]
    marked: list[Any] = list(out.get("assistant_masks") or [])
    mask = [int(m) for m in marked]
    if len(mask) != len(ids) or not any(mask):
        return None
    return ids, mask


def _weight(message: dict[str, Any]) -> int:
    weight = message.get("weight", 1)
    if isinstance(weight, bool) or weight not in (0, 1):
        raise DemonstrationError(f"an assistant message's weight must be 0 or 1, got {weight!r}")
    return int(weight)


def _drop_spans(mask: list[int], weights: list[int]) -> list[int]:
    """Zero the assistant-mask spans (one per assistant message, in order) whose message has weight 0."""
    spans: list[tuple[int, int]] = []
    for i, m in enumerate(mask):
        if m and (i == 0 or not mask[i - 1]):
            spans.append((i, i))
        if m:
            spans[-1] = (spans[-1][0], i + 1)
    if len(spans) != len(weights):
        raise DemonstrationError(
            f"the chat template marked {len(spans)} assistant spans for {len(weights)} assistant messages; "
            "per-message weights need one contiguous span per message"
        )
    out = list(mask)
    for (start, end), weight in zip(spans, weights, strict=True):
        if weight == 0:
            out[start:end] = [0] * (end - start)
    return out


def sft_layout(requested: SFTLayout, policy: Policy) -> SupervisedLayout:
    """The layout of the warm start's forward: ``auto`` is ``packed`` where attention is varlen, else ``padded``.

    Packed micro-batches with varlen attention carry no padding. Without a varlen kernel (``sdpa``, ``eager``) a
    packed row attends through an ``N × N`` block-diagonal mask, and models with linear-attention layers cannot
    be packed at all (`mcprl_policy.attention.is_packable`): both get padded.
    """
    match requested:
        case "auto":
            return "packed" if is_packable(policy.model) and uses_varlen(policy.model) else "padded"
        case "packed":
            check_packable(policy.model)
            return "packed"
        case "padded":
            return "padded"
        case "prefix_grouped":
            check_prefix_groupable(policy.model)
            return "prefix_grouped"
        case _:
            assert_never(requested)


def teacher_success(demos: Sequence[Demonstration]) -> float | None:
    """The scored demonstrations' success rate (None when none is scored), logged with their count."""
    scored = [d.succeeds for d in demos if d.succeeds is not None]
    rate = sum(scored) / len(scored) if scored else None
    logger.info("demonstrations", demos=len(demos), teacher_success=rate)
    return rate


class SFTStage:
    """Supervised fine-tuning with its own optimizer, schedule and metrics (`sft/*`).

    The value head is not trained here (there is no return to regress on); only the language model's
    trainable parameters are. Hyperparameters come from ``sft`` (lr, batch size, warmup, clipping, the forward's
    layout: `sft_layout`) and ``optim`` (micro-batch packing).
    """

    def __init__(
        self,
        *,
        policy: Policy,
        sft: SFTConfig,
        optim: OptimConfig,
        examples: Sequence[SFTExample],
        seed: int,
    ) -> None:
        if not examples:
            raise ValueError("SFT needs at least one demonstration")
        self.policy = policy
        self.config = sft
        self.optim = optim
        self.examples = list(examples)
        self.params = [p for p in policy.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=sft.lr, weight_decay=0.0)
        self.scheduler = lr_schedule(self.optimizer, sft.warmup_steps, self.total_steps, sft.scheduler)
        self.layout: SupervisedLayout = sft_layout(sft.layout, policy)
        self.rng = random.Random(seed)
        self.order: list[int] = []
        self.step = 0
        self.epoch = 0

    @classmethod
    def from_demonstrations(
        cls,
        policy: Policy,
        demos: Sequence[Demonstration],
        tasks: IndexedTasks,
        env: Environment,
        config: Config,
    ) -> SFTStage:
        """The stage on ``demos`` rendered as the environment renders each task (`render_demonstrations`)."""
        end_of_turn = end_of_turn_ids(policy.tokenizer, policy.model)
        examples = render_demonstrations(policy.tokenizer, demos, tasks, env, end_of_turn=end_of_turn)
        return cls(policy=policy, sft=config.sft, optim=config.optim, examples=examples, seed=config.run.seed)

    @property
    def total_steps(self) -> int:
        """The stage's length: ``sft.steps``, or ``sft.epochs`` passes over the demonstrations."""
        return self.config.total_steps(len(self.examples))

    def next_batch(self) -> list[SFTExample]:
        batch: list[SFTExample] = []
        while len(batch) < self.config.batch_size:
            if not self.order:
                self.order = list(range(len(self.examples)))
                self.rng.shuffle(self.order)
                self.epoch += 1
            batch.append(self.examples[self.order.pop()])
        return batch

    def train_step(self) -> dict[str, float]:
        """One optimizer step over `batch_size` demonstrations (packed micro-batches, token-mean loss).

        The forward is `mcprl_policy.supervised.target_logprobs`: only the assistant tokens reach the output
        head, no entropy is computed and their logits are not recomputed in backward.
        """
        t0 = time.perf_counter()
        batch = self.next_batch()
        total = max(1, sum(e.num_targets for e in batch))
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        correct = 0.0
        turns_right = turns = 0
        for b in self._micro_batches(batch):
            items = [batch[i] for i in b]
            lp = target_logprobs(
                self.policy, [e.token_ids for e in items], [e.targets for e in items], layout=self.layout
            )
            loss = -lp.sum() / total
            torch.autograd.backward(loss)
            loss_sum += float(loss.detach()) * total
            # A target is "right" when the model gives it > 1/2 probability (then it is also its argmax).
            right = lp.detach() > math.log(0.5)
            correct += float(right.sum())
            lengths = [n for e in items for n in e.turn_lengths]
            turns += len(lengths)
            turns_right += sum(bool(turn.all()) for turn in torch.split(right, lengths))
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.config.max_grad_norm))
        optimizer_step(self.optimizer)
        self.scheduler.step()
        self.step += 1
        return {
            "sft/loss": loss_sum / total,
            "sft/token_acc": correct / total,
            # Whole assistant turns right: a turn's few deciding tokens (call another tool or answer?) weigh
            # little in the token mean, which can sit at 0.99 while no second turn is right.
            "sft/turn_acc": turns_right / max(1, turns),
            "sft/grad_norm": norm,
            "sft/lr": float(self.optimizer.param_groups[0]["lr"]),
            "sft/epoch": float(self.epoch),
            "sft/tokens": float(total),
            "perf/sft_step_s": time.perf_counter() - t0,
        }

    def _micro_batches(self, batch: Sequence[SFTExample]) -> list[list[int]]:
        """Indices of ``batch`` per micro-batch of at most ``optim.micro_batch_tokens`` computed tokens."""
        if self.layout == "prefix_grouped":
            return pack_prefix_groups([e.token_ids for e in batch], self.optim.micro_batch_tokens)
        return pack_indices([len(e.token_ids) for e in batch], self.optim.micro_batch_tokens)

    def state_dict(self) -> dict[str, Any]:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": self.rng.getstate(),
            "order": list(self.order),
            "step": self.step,
            "epoch": self.epoch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.rng.setstate(state["rng"])
        self.order = list(state["order"])
        self.step = int(state["step"])
        self.epoch = int(state["epoch"])
