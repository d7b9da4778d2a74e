"""``mcprl-tasks`` command line: generate task sets, list families and presets."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from mcprl_tasks.errors import TasksError
from mcprl_tasks.generate import generate_split, write_split
from mcprl_tasks.presets import PRESETS, write_presets
from mcprl_tasks.registry import FAMILIES
from mcprl_tasks.universe import Universe

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mcprl-tasks", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="write train.json and validation.json")
    gen.add_argument("--out", required=True, help="output directory")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--n-train", type=int, default=5000)
    gen.add_argument("--n-val", type=int, default=1000)
    gen.add_argument("--families", nargs="+", default=sorted(FAMILIES), metavar="FAMILY")
    gen.add_argument("--symbols", type=int, default=40, help="use the first N fixture companies")
    gen.add_argument("--style", choices=("short", "natural"), default="natural")
    gen.add_argument("--val-fraction", type=float, default=0.2, help="combinations held out for validation")
    sub.add_parser("families", help="list task families")
    sub.add_parser("presets", help="list shipped presets")
    sub.add_parser("build-presets", help="regenerate the shipped presets into the package data directory")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        match args.command:
            case "generate":
                universe = Universe.first(args.symbols, style=args.style)
                train, val = generate_split(
                    seed=args.seed,
                    n_train=args.n_train,
                    n_val=args.n_val,
                    families=args.families,
                    universe=universe,
                    val_fraction=args.val_fraction,
                )
                for path in write_split(args.out, train, val):
                    print(path)
            case "families":
                print("\n".join(sorted(FAMILIES)))
            case "presets":
                for name, preset in PRESETS.items():
                    print(f"{name}: {preset.description}")
            case "build-presets":
                for path in write_presets():
                    print(path)
            case _:
                raise AssertionError(args.command)
    except (TasksError, ValueError) as exc:
        print(f"mcprl-tasks: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
