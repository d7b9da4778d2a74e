"""``mcprl-train``: the arguments of each subcommand (listed in the README), the dispatch, the error boundary.

``train`` is the default subcommand: ``mcprl-train`` alone trains the ``cpu`` profile. The heavy modules
(trainer, evaluation, DeepSpeed) are imported only by the subcommands that need them.

A user's mistake (a bad config key, a missing task or servers file, a server that does not start) ends in
one red ``error:`` line and exit code 2; ``--debug`` (before or after the subcommand) prints the traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from mcprl_train.config import DEFAULT_PROFILE, Config, list_profiles
from mcprl_train.errors import TrainError

__all__ = ["build_parser", "main"]

_SUBCOMMANDS = ("train", "config", "plan", "eval", "doctor", "plots", "export", "collect-demos")
_GLOBAL_FLAGS = ("--debug",)

# The base error of each library: `(module, class)`.
_LIBRARY_ERRORS = (
    ("mcprl_tools.errors", "ToolsError"),
    ("mcprl_env.errors", "EnvError"),
    ("mcprl_policy.errors", "PolicyError"),
    ("mcprl_grpo.errors", "GrpoError"),
)


def _reported_errors() -> tuple[type[Exception], ...]:
    """The errors reported as one line: mcprl-train's, the loaded libraries' and the OS errors of a bad path.

    A library's base error is looked up among the loaded modules instead of imported: an error of a library
    that was never imported cannot have been raised, and importing a library the subcommand did not need (the
    MCP SDK behind mcprl-tools, for ``mcprl-train config``) would only slow the start.
    """
    errors: list[type[Exception]] = [TrainError, OSError]
    for module, name in _LIBRARY_ERRORS:
        loaded = sys.modules.get(module)
        if loaded is not None:
            errors.append(getattr(loaded, name))
    return tuple(errors)


def _add_debug_arg(parser: argparse.ArgumentParser, *, default: bool | str) -> None:
    parser.add_argument(
        "--debug", action="store_true", default=default, help="print the traceback of an error"
    )


def _add_config_args(parser: argparse.ArgumentParser, *, profile: bool = True) -> None:
    if profile:
        parser.add_argument(
            "--profile",
            default=None,
            help=f"shipped profile ({', '.join(list_profiles())}; default {DEFAULT_PROFILE})",
        )
        parser.add_argument("--config", type=Path, default=None, help="YAML/JSON file overriding the profile")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one key, e.g. --set grpo.group_size=8 (repeatable; values parsed as YAML)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (``train`` is inserted when no subcommand is given)."""
    parser = argparse.ArgumentParser(
        prog="mcprl-train", description="GRPO training of tool-using LLM agents on MCP servers."
    )
    _add_debug_arg(parser, default=False)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train (the default subcommand)")
    _add_config_args(train)
    train.add_argument("--run-name", default=None, help="run directory name under run.output_dir")
    train.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=None,
        metavar="DIR",
        help="continue a run from its last complete checkpoint (DIR, or the newest run in run.output_dir)",
    )
    config = sub.add_parser("config", help="print the resolved config as YAML")
    _add_config_args(config)
    plan = sub.add_parser(
        "plan",
        help="memory preflight: will the profile fit its devices? (and, --from-run, how long it takes)",
    )
    _add_config_args(plan)
    plan.add_argument("--model", default=None, help="model name or directory (overrides model.name)")
    plan.add_argument(
        "--from-run",
        type=Path,
        default=None,
        metavar="DIR",
        help="also project the run's time from a probe run's measured phases (a short run of this config)",
    )
    evaluate = sub.add_parser("eval", help="evaluate a saved checkpoint on the validation tasks")
    evaluate.add_argument("--checkpoint", type=Path, required=True, help="a checkpoint or run directory")
    _add_config_args(evaluate, profile=False)
    doctor = sub.add_parser(
        "doctor", help="check installation, devices, keys, MCP servers, task data and the model's template"
    )
    _add_config_args(doctor)
    doctor.add_argument("--skip-servers", action="store_true", help="do not start the MCP servers")
    plots = sub.add_parser("plots", help="(re)write the PNG plots of a run")
    plots.add_argument("run_dir", type=Path)
    export = sub.add_parser("export", help="write a checkpoint as a Hugging Face model directory")
    _add_export_args(export)
    collect = sub.add_parser(
        "collect-demos",
        help="demonstrations by rejection sampling from a model behind an OpenAI-compatible API",
    )
    _add_config_args(collect)
    collect.add_argument("--base-url", required=True, help="API root, e.g. http://localhost:8000/v1")
    collect.add_argument("--model", required=True, help="the model name the endpoint serves")
    collect.add_argument("--api-key-env", default=None, help="environment variable holding the API key")
    collect.add_argument("--out", type=Path, required=True, help="JSONL to write (read by sft.demos_path)")
    collect.add_argument("--attempts", type=int, default=1, help="episodes per task until one succeeds")
    collect.add_argument("--max-tasks", type=int, default=None, help="only the first N training tasks")
    collect.add_argument("--temperature", type=float, default=1.0)
    for subparser in (train, config, plan, evaluate, doctor, plots, export, collect):
        # SUPPRESS: a subcommand without --debug keeps the value given before the subcommand.
        _add_debug_arg(subparser, default=argparse.SUPPRESS)
    return parser


def _add_export_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint", type=Path, help="a checkpoint directory, or a run (its latest checkpoint)"
    )
    parser.add_argument("output", type=Path, help="the model directory to create")
    parser.add_argument("--adapter", action="store_true", help="also write the LoRA adapter alone (adapter/)")
    parser.add_argument("--force", action="store_true", help="replace an existing non-empty output directory")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default=None,
        help="weights' dtype (default: the run's)",
    )
    parser.add_argument(
        "--push-to-hub", default=None, metavar="REPO", help="then upload to this hub repository"
    )
    parser.add_argument("--private", action="store_true", help="create the hub repository private")


def _with_default_command(argv: Sequence[str]) -> list[str]:
    args = list(argv)
    flags = 0
    while flags < len(args) and args[flags] in _GLOBAL_FLAGS:
        flags += 1
    rest = args[flags:]
    if not rest or (rest[0] not in _SUBCOMMANDS and rest[0] not in ("-h", "--help")):
        return [*args[:flags], "train", *rest]
    return args


def _load(args: argparse.Namespace) -> Config:
    """Profile (default ``cpu``) ← ``--config`` file ← ``--set`` overrides."""
    return Config.load(
        profile=args.profile or DEFAULT_PROFILE, config_file=args.config, overrides=args.overrides
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mcprl-train`` console script; returns the exit code."""
    from mcprl_train.parallel.launch import strip_local_rank

    raw = strip_local_rank(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(_with_default_command(raw))
    try:
        return _run(args, raw)
    except _reported_errors() as exc:  # evaluated when an exception arrives: the libraries loaded by then
        if args.debug:
            traceback.print_exc()
        else:
            Console(stderr=True).print(
                f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True, highlight=False
            )
        return 2


def _run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    match args.command:
        case "config":
            sys.stdout.write(_load(args).to_yaml())
            return 0
        case "plan":
            return _plan(args)
        case "doctor":
            return _doctor(args)
        case "plots":
            return _plots(args)
        case "eval":
            return _eval(args)
        case "export":
            return _export(args)
        case "collect-demos":
            return _collect_demos(args)
        case _:
            return _train(args, argv)


def _collect_demos(args: argparse.Namespace) -> int:
    from mcprl_train.commands.collect_demos import Endpoint, run_collect

    if args.attempts < 1:
        raise TrainError(f"--attempts must be at least 1, got {args.attempts}")
    endpoint = Endpoint.from_env(
        args.base_url, args.model, api_key_env=args.api_key_env, temperature=args.temperature
    )
    counts = run_collect(_load(args), endpoint, args.out, attempts=args.attempts, max_tasks=args.max_tasks)
    sys.stdout.write(
        f"{int(counts['collect/kept'])} of {int(counts['collect/tasks'])} tasks solved in "
        f"{int(counts['collect/episodes'])} episodes; wrote {args.out} (use --set sft.demos_path={args.out})\n"
    )
    return 0


def _plan(args: argparse.Namespace) -> int:
    from mcprl_train.commands.plan import load_model_shape, plan_memory, render_plan

    config = _load(args)
    if args.model is not None:
        config = config.replace([f"model.name={args.model}"])
    plan = plan_memory(config, load_model_shape(config.model.name))
    Console().print(render_plan(plan))
    if args.from_run is not None:
        from mcprl_train.commands.time_plan import plan_time, probe_rates, render_time_plan

        Console().print(render_time_plan(plan_time(config, probe_rates(args.from_run))))
    return 0 if plan.fits is not False else 1


def _doctor(args: argparse.Namespace) -> int:
    from mcprl_train.commands.doctor import render_report, run_checks

    config = _load(args)
    results = run_checks(config, servers=not args.skip_servers)
    Console(width=max(160, Console().width)).print(render_report(results))
    return 0 if all(r.ok for r in results) else 1


def _plots(args: argparse.Namespace) -> int:
    from mcprl_train.run.plots import write_plots
    from mcprl_train.run.run_dir import RunDir

    for path in write_plots(RunDir.open(args.run_dir)):
        print(path)
    return 0


def _export(args: argparse.Namespace) -> int:
    from mcprl_train.commands.export import export_checkpoint, hub_token, push_export

    # The hub token is checked before anything is written.
    token = hub_token(args.push_to_hub) if args.push_to_hub is not None else None
    exported = export_checkpoint(
        args.checkpoint,
        args.output,
        adapter=args.adapter,
        force=args.force,
        dtype=args.dtype,
        model_ref=args.push_to_hub,
    )
    for name, reason in exported.skipped.items():
        print(f"skipped {name}: {reason}")
    print(f"exported {exported.checkpoint} (step {exported.step}) to {exported.path}")
    if args.push_to_hub is not None and token is not None:
        print(f"pushed to {push_export(exported.path, args.push_to_hub, token=token, private=args.private)}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    import anyio

    from mcprl_train.commands.evaluate import evaluate_checkpoint
    from mcprl_train.run.tracking import configure_logging

    configure_logging()
    summary = anyio.run(evaluate_checkpoint, Path(args.checkpoint), list(args.overrides))
    print(json.dumps(summary, indent=2, sort_keys=True, default=str))
    return 0


def _train(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from mcprl_train.commands.train import train

    return train(
        lambda: _load(args),
        resume=args.resume,
        run_name=args.run_name,
        overrides=args.overrides,
        argv=argv,
    )
