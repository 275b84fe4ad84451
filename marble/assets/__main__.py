"""`python -m marble.assets` is `marble download` (marble.assets.download)."""

from marble.assets.download import main

raise SystemExit(main())
