"""Downloads: the sha256-pinned manifest (`manifest.yaml`), `marble download` (`download`) and
pinned hub snapshots with retries (`hub`). Everything that reaches the network lives here."""
