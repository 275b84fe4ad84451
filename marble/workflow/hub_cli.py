"""`marble hub lock`: resolve the config's PIN-A-COMMIT hub references into its lock file
(marble.workflow.hub_lock, which says why and how the lock is applied)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from marble.workflow import configs
from marble.workflow.hub_lock import LOCK_KEY, PLACEHOLDER, lock, placeholders


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="marble hub", description=__doc__.splitlines()[0])
    p.add_argument("action", choices=["lock"])
    p.add_argument("--configfile", nargs="+", default=["config/paper.yaml"], metavar="FILE")
    p.add_argument("--out", type=Path, default=None, help="the lock file (default: the config's hub_lock)")
    args = p.parse_args(argv)
    raw = configs.load(args.configfile, apply_hub_lock=False)
    out = args.out or Path(raw.get(LOCK_KEY) or "config/hub.lock")
    if not placeholders(raw):
        print(f"marble hub lock: no {PLACEHOLDER} reference in {' '.join(args.configfile)}")
        return 0
    try:
        found = lock(raw, out)
    except Exception as exc:  # the hub's errors (offline, 404, 401) as one line
        print(f"marble hub lock: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    for repo, entry in found.items():
        print(f"{repo}: {entry['commit']}")
    print(f"wrote {out} ({len(found)} locked)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
