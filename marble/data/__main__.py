"""`python -m marble.data` is `marble data` (marble.data.cli)."""

from marble.data.cli import main

raise SystemExit(main())
