"""Task sets and deterministic task generators for the offline servers.

``load_preset("demo")`` returns the shipped ``(train.json, validation.json)`` paths; :func:`generate_split`
builds new sets; :mod:`mcprl_tasks.demos` turns tasks into warm-start demonstrations.
"""

from mcprl_tasks.demo_mix import PlannedDemo, family_quotas, plan_demos
from mcprl_tasks.demos import demo_succeeds, ideal_demo, imperfect_teacher, tool_call_text, with_reasoning
from mcprl_tasks.errors import TasksError, UnknownFamilyError, UnknownPresetError
from mcprl_tasks.generate import generate_split, generate_tasks, split_combos, write_split
from mcprl_tasks.presets import PRESETS, build_preset, load_preset
from mcprl_tasks.registry import DEMO_FAMILIES, FAMILIES
from mcprl_tasks.schema import read_tasks, write_tasks
from mcprl_tasks.universe import Universe

__all__ = [
    "DEMO_FAMILIES",
    "FAMILIES",
    "PRESETS",
    "PlannedDemo",
    "TasksError",
    "Universe",
    "UnknownFamilyError",
    "UnknownPresetError",
    "build_preset",
    "demo_succeeds",
    "family_quotas",
    "generate_split",
    "generate_tasks",
    "ideal_demo",
    "imperfect_teacher",
    "load_preset",
    "plan_demos",
    "read_tasks",
    "split_combos",
    "tool_call_text",
    "with_reasoning",
    "write_split",
    "write_tasks",
]
