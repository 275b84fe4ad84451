"""`python -m marble.models` is `marble models` (marble.models.cli)."""

from marble.models.cli import main

raise SystemExit(main())
