"""The `marble` command: one entry point, one module per subcommand.

Each subcommand lives in its own module with a `main(argv)` and also runs as
`python -m marble.<module>`; this file only dispatches, so `marble --help` stays fast
(no torch import until a subcommand needs it).
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "train": ("marble.train", "train a LoRA with DiffusionNFT + a reward balancer"),
    "evaluate": ("marble.evaluate", "generate and score a checkpoint on a benchmark"),
    "bench": ("marble.tools.bench", "time balancers side by side (step time, peak memory)"),
    "data": ("marble.data.cli", "assemble datasets, embedding cache, tiny prompt set"),
    "download": ("marble.assets.download", "fetch model, reward checkpoints and prompts (sha256-pinned)"),
    "models": ("marble.models.cli", "build the tiny SD3 model from configs"),
    "rewards": ("marble.rewards.cli", "list rewards, score images"),
    "report": ("marble.report.cli", "tables and figures from runs and evaluations"),
    "tables": ("marble.report.tables_cli", "the paper's tables (rho, harmony, cost), ours beside"),
    "plan": ("marble.workflow.plan_cli", "what a target would run (its dry run) and its GPU-hours from counted FLOPs"),
    "hub": ("marble.workflow.hub_cli", "lock: resolve PIN-A-COMMIT hub references into the config's lock file"),
    "doctor": ("marble.doctor", "check that a workflow config can run here (rewards, weights, GPU, disk, SLURM)"),
}


def usage() -> str:
    lines = ["usage: marble <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`marble <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from marble import __version__

        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"marble: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    result = module.main(rest)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
