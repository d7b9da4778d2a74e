"""The messaging workspace's seed state: channels, users and messages every episode starts from.

Messages in the channels tasks post to (``general``, ``markets``, ``trading``, ``reports``) contain no digits,
so a state check such as "a message containing 42.17 was posted" can only be satisfied by the agent.
"""

from __future__ import annotations

__all__ = ["POST_CHANNELS", "SEED_CHANNELS", "SEED_EPOCH", "SEED_MESSAGES", "SEED_USERS"]

SEED_EPOCH = 1_767_225_600  # 2026-01-01T00:00:00Z

# (name, topic, members)
SEED_CHANNELS: tuple[tuple[str, str, int], ...] = (
    ("general", "Company-wide announcements", 42),
    ("random", "Off-topic chatter", 37),
    ("markets", "Market moves and price alerts", 18),
    ("trading", "Desk coordination", 9),
    ("reports", "Daily and weekly reports", 14),
    ("engineering", "Platform and infrastructure", 21),
    ("support", "Customer escalations", 11),
)

POST_CHANNELS: tuple[str, ...] = ("general", "markets", "trading", "reports")

# (name, real name, title)
SEED_USERS: tuple[tuple[str, str, str], ...] = (
    ("agent", "Research Agent", "Automated assistant"),
    ("alice", "Alice Moreau", "Head of Research"),
    ("bruno", "Bruno Tanaka", "Senior Trader"),
    ("chen", "Chen Alvarez", "Platform Engineer"),
    ("dara", "Dara Okafor", "Head of Sales"),
    ("emil", "Emil Novak", "Support Lead"),
    ("fatima", "Fatima Iyer", "Quant Analyst"),
    ("gus", "Gus Walsh", "Office Manager"),
)

# (channel, user, seconds after SEED_EPOCH, text)
SEED_MESSAGES: tuple[tuple[str, str, int, str], ...] = (
    ("general", "gus", 60, "Welcome to the workspace! Please keep announcements in this channel."),
    ("general", "alice", 3600, "The quarterly offsite will be held in Lakeview. Details to follow."),
    ("general", "dara", 7200, "Big thanks to the sales team for closing the Northport deal."),
    ("general", "gus", 9000, "Reminder: the kitchen will be cleaned on Friday afternoon."),
    ("general", "emil", 12000, "Support rotation schedule is pinned in the support channel."),
    ("markets", "fatima", 1800, "Energy names look heavy this morning."),
    ("markets", "bruno", 5400, "Watching the healthcare group after the sector rotation."),
    ("markets", "alice", 10800, "Please post price checks here with the ticker symbol."),
    ("trading", "bruno", 2400, "Desk is flat going into the close."),
    ("trading", "fatima", 6000, "Rebalance model finished; no action needed today."),
    ("reports", "alice", 4000, "Weekly research summary goes out every Monday morning."),
    ("reports", "fatima", 8000, "Risk report template updated; use the new headers."),
    ("random", "chen", 900, "Anyone up for lunch at 12:30?"),
    ("random", "gus", 4500, "Lost and found: a blue umbrella near desk 14."),
    ("random", "dara", 9500, "The coffee machine on floor 3 is fixed."),
    ("engineering", "chen", 1200, "Deploy of the pricing service v2.4 is scheduled for 16:00 UTC."),
    ("engineering", "chen", 7800, "Postmortem for the cache outage is in the wiki, page 7."),
    ("engineering", "alice", 11000, "Can we get the nightly backfill moved to 02:00?"),
    ("support", "emil", 3000, "Ticket 4512 escalated: customer cannot export statements."),
    ("support", "dara", 6500, "The Eastbridge account renewal is due in 30 days."),
    ("support", "emil", 13000, "Ticket 4512 resolved after the export fix."),
)
