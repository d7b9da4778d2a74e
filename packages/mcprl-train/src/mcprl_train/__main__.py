"""``python -m mcprl_train`` = ``mcprl-train``."""

from mcprl_train.cli import main

raise SystemExit(main())
