"""Does an exported agent call tools? Load an `mcprl-train export` directory the way its model card says
(transformers' Auto classes, the saved chat template, the saved greedy generation config) and ask it the first
held-out task of each family, with the tool schemas of the run's own MCP servers.

    uv run python scripts/export_answers.py EXPORT_DIR

Prints each family's first generated turn and whether the run's parser reads it as calls of tools the task
offers.
The servers start as the training run started them (`mcprl_train_config.yaml` in the export); their logs go to
a temporary directory.
"""

import sys
import tempfile
from pathlib import Path

import anyio
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import mcprl_tasks
from mcprl_env.parsing import resolve_parser
from mcprl_train import build
from mcprl_train.cassettes import tool_manager
from mcprl_train.config import Config

export = Path(sys.argv[1])
torch.set_num_threads(1)
tokenizer = AutoTokenizer.from_pretrained(export)
model = AutoModelForCausalLM.from_pretrained(export)
cfg = Config.load(config_file=export / "mcprl_train_config.yaml", profile=None)
parser = resolve_parser(cfg.env.parser, tokenizer, template_kwargs=cfg.env.chat_template_kwargs)
tasks = mcprl_tasks.read_tasks(build.task_path(cfg.tasks.validation, name="validation"))
first = {}
for t in tasks:
    fam = t["metadata"]["family"]
    first.setdefault(fam, t)


async def main():
    async with tool_manager(cfg, Path(tempfile.mkdtemp(prefix="export-answers-")), world_size=1) as manager:
        n_call = 0
        for fam, t in sorted(first.items()):
            schemas = manager.tool_schemas(t.get("servers"))
            offered = {s["function"]["name"] for s in schemas}
            messages = [{"role": "user", "content": t["prompt"]}]
            inputs = tokenizer.apply_chat_template(
                messages, tools=schemas, add_generation_prompt=True, return_tensors="pt", return_dict=True
            )
            out = model.generate(**inputs)
            text = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
            turn = parser.parse(text, tools=schemas)
            ok = bool(turn.calls) and not turn.errors and all(c.name in offered for c in turn.calls)
            n_call += ok
            print(f"{fam:14s} {'CALL' if ok else '----'} {t['prompt'][:60]!r} -> {text.strip()[:120]!r}")
        print(f"held-out tasks answered with a call of an offered tool: {n_call}/{len(first)}")


anyio.run(main)
