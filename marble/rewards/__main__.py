"""`python -m marble.rewards` is `marble rewards` (marble.rewards.cli)."""

from marble.rewards.cli import main

raise SystemExit(main())
