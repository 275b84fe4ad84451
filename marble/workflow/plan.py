"""Which configured runs each of the paper's tables needs (the `paper_tables` plan).

Paper mode: a table takes the runs whose preset is one of its rows (`TABLE_PRESETS`), so a
run in two tables (rho_07: MARBLE in Table 1 and the rho = 0.7 row of the ablation) is
planned, trained and counted once. Tiny mode: every table is the toy analogue over every
run (there are no per-table presets at toy scale). `cost` trains nothing: it is the bench.
"""

from __future__ import annotations

import re

TABLES = ("table1", "rho_ablation", "harmony", "cost")
# The trained rows of each paper table, by preset (docs/algorithm.md section E).
TABLE_PRESETS = {
    # Table 1's own trainings: "+ DiffusionNFT (weighted-sum)", "+ MARBLE" and
    # "+ DiffusionNFT (sequential)" (its staged schedule); the other rows are published or
    # public checkpoints, evaluated, not trained.
    "table1": ("weighted_sum", "rho_07", "sequential"),
    "rho_ablation": ("rho_01", "rho_03", "rho_05", "rho_07", "rho_09"),
    # The page compares the weighted sum with MARBLE as released.
    "harmony": ("weighted_sum", "rho_07"),
    "cost": (),
}


def table_runs(runs: dict, mode: str) -> dict[str, list[str]]:
    """{table: the configured run names it needs}, in config order."""
    if mode != "paper":
        return {t: ([] if t == "cost" else list(runs)) for t in TABLES}
    return {t: [name for name, spec in runs.items() if spec["preset"] in TABLE_PRESETS[t]]
            for t in TABLES}


def planned_runs(by_table: dict[str, list[str]]) -> list[str]:
    """Every run the tables need, each once, in first-needed order."""
    return list(dict.fromkeys(r for names in by_table.values() for r in names))


def missing_rows(runs: dict, mode: str) -> dict[str, list[str]]:
    """{table: presets it needs that no configured run uses} (paper mode; else empty)."""
    if mode != "paper":
        return {}
    used = {spec["preset"] for spec in runs.values()}
    out = {t: [p for p in presets if p not in used] for t, presets in TABLE_PRESETS.items()}
    return {t: p for t, p in out.items() if p}


_SHORT_FLAGS = re.compile(r"^-[A-Za-z]*n[A-Za-z]*$")


def is_dry_run(argv: list[str]) -> bool:
    """Snakemake's `-n` / `--dry-run` / `--dryrun`, also inside a short-flag cluster (`-np`)."""
    return any(a in ("--dry-run", "--dryrun") or _SHORT_FLAGS.match(a) for a in argv)
