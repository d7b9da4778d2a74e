"""Task families over the messaging server: workspace questions and relaying a message between channels."""

from __future__ import annotations

import random

from mcprl_servers.workspace_seed import POST_CHANNELS, SEED_CHANNELS, SEED_MESSAGES, SEED_USERS
from mcprl_tasks.family import Combo, Draft, Family
from mcprl_tasks.schema import contains_checker, posted_checker
from mcprl_tasks.universe import Universe

__all__ = ["MESSAGING_FAMILIES", "latest_message"]

# (distinctive phrase in a seed message, how the prompt refers to it, search query an agent would use)
_ABOUT: tuple[tuple[str, str, str], ...] = (
    ("quarterly offsite", "the quarterly offsite", "offsite"),
    ("Northport deal", "the Northport deal", "Northport"),
    ("kitchen will be cleaned", "the kitchen cleaning", "kitchen"),
    ("Energy names", "energy stocks looking heavy", "energy"),
    ("healthcare group", "the healthcare group", "healthcare"),
    ("Rebalance model", "the rebalance model", "rebalance"),
    ("Risk report template", "the risk report template", "risk report"),
    ("blue umbrella", "a lost umbrella", "umbrella"),
    ("coffee machine", "the coffee machine", "coffee"),
    ("pricing service", "the pricing service deploy", "deploy"),
    ("cache outage", "the cache outage postmortem", "postmortem"),
    ("nightly backfill", "the nightly backfill", "backfill"),
    ("Eastbridge account", "the Eastbridge renewal", "Eastbridge"),
)
_USERS = [u for u in SEED_USERS if u[0] != "agent"]


def latest_message(channel: str) -> tuple[str, str]:
    """(user, text) of the newest seed message in ``channel``."""
    rows = [(offset, user, text) for ch, user, offset, text in SEED_MESSAGES if ch == channel]
    _, user, text = max(rows)
    return user, text


def _author(phrase: str) -> str:
    (user,) = [u for _, u, _, t in SEED_MESSAGES if phrase in t]
    return user


def _channel_topic(combo: Combo, rng: random.Random, u: Universe) -> Draft:
    (channel,) = combo
    topic = next(t for name, t, _ in SEED_CHANNELS if name == channel)
    prompt = rng.choice(("What is the topic of #{c}?", "What is the #{c} channel for?"))
    return Draft(
        prompt=prompt.format(c=channel),
        servers=["messaging"],
        difficulty="easy",
        answer=topic,
        checker=contains_checker(),
        min_tool_calls=1,
        params={"channel": channel},
    )


def _user_lookup(combo: Combo, rng: random.Random, u: Universe) -> Draft:
    name, direction = combo
    user = next(x for x in _USERS if x[0] == name)
    if direction == "title":
        prompt, answer = (
            rng.choice(("What is {r}'s job title?", "What does {r} do here?")).format(r=user[1]),
            user[2],
        )
    else:
        prompt, answer = (
            rng.choice(("Who is our {t}?", "Which colleague is the {t}?")).format(t=user[2]),
            user[1],
        )
    return Draft(
        prompt=prompt,
        servers=["messaging"],
        difficulty="easy",
        answer=answer,
        checker=contains_checker(),
        min_tool_calls=1,
        params={"user": name, "direction": direction},
    )


def _who_posted(combo: Combo, rng: random.Random, u: Universe) -> Draft:
    (phrase,) = combo
    assert isinstance(phrase, str)
    _, about, query = next(a for a in _ABOUT if a[0] == phrase)
    prompt = rng.choice(("Who posted about {a}?", "Which user wrote the message about {a}?"))
    return Draft(
        prompt=prompt.format(a=about),
        servers=["messaging"],
        difficulty="medium",
        answer=_author(phrase),
        checker=contains_checker(),
        min_tool_calls=1,
        params={"query": query, "phrase": phrase},
    )


def _relay(combo: Combo, rng: random.Random, u: Universe) -> Draft:
    source, target = combo
    assert isinstance(source, str)
    assert isinstance(target, str)
    _, text = latest_message(source)
    prompt = rng.choice(
        (
            "Forward the latest message in #{s} to #{t}.",
            "Repost the newest #{s} message in #{t}, word for word.",
        )
    )
    return Draft(
        prompt=prompt.format(s=source, t=target),
        servers=["messaging"],
        difficulty="medium",
        answer=text,
        checker=posted_checker(target, text),
        min_tool_calls=2,
        params={"source": source, "channel": target},
    )


MESSAGING_FAMILIES: tuple[Family, ...] = (
    Family(name="channel_topic", combos=lambda u: [(c[0],) for c in SEED_CHANNELS], build=_channel_topic),
    Family(
        name="user_lookup",
        combos=lambda u: [(x[0], d) for x in _USERS for d in ("title", "name")],
        build=_user_lookup,
    ),
    Family(name="who_posted", combos=lambda u: [(a[0],) for a in _ABOUT], build=_who_posted),
    Family(
        name="relay",
        combos=lambda u: [(s[0], t) for s in SEED_CHANNELS for t in POST_CHANNELS if s[0] != t],
        build=_relay,
    ),
)
