"""The training loop and what it owns: rollouts + scoring (`rollout`), the DiffusionNFT
micro-step (`microstep`), the optimisation loop (`trainer`), the checkpoint format and exact
resume (`checkpoint`), requeue signals (`stopping`), metrics and trackers. The CLI is
`marble.train` (`python -m marble.train`)."""
