"""The report's first section: the paper's tables with ours beside them, a headline figure
per table (bars per metric, ours vs published), each table compact ("ours / published" per
cell). Tiny runs get the same layout, labelled as toy analogues."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from marble.report import figures, paper_tables
from marble.report.loading import RunData
from marble.report.render import Figure, Table, Text

LEAD_TITLE = "The paper's tables, ours beside them"
TOY_NOTE = ("Toy analogues: these runs are the tiny model with toy rewards (brightness and "
            "saturation stand in for the general rewards, text contrast for OCR, colour match "
            "for GenEval), so their columns are not the paper's: compare directions and "
            "orderings, not values. Published numbers: the MARBLE project page.")


def is_paper_scale(run: RunData) -> bool:
    path = str((run.config.get("model") or {}).get("path", ""))
    return "stable-diffusion-3.5" in path or "sd35m" in path


def released_marble(runs: list[RunData]) -> list[RunData]:
    """The runs a weighted-sum-vs-MARBLE table compares: every non-MARBLE run, and the
    MARBLE runs as released (rho = 0.7; the reference's masking when such runs exist), so
    the rho ablation's other runs are not pooled into "MARBLE"."""
    marble = [r for r in runs if r.balancer == "marble" and r.alpha_ema in (0.7, None)]
    reference = [r for r in marble if not (r.config.get("balancer") or {}).get("exact_masking")]
    return [r for r in runs if r.balancer != "marble"] + (reference or marble)


def _notes(frame: pd.DataFrame) -> str:
    bases = [b for b in dict.fromkeys(frame["basis"]) if b]
    sources = [s.removeprefix("published: ") for s in dict.fromkeys(frame["source"]) if s]
    return ("Ours: " + "; ".join(bases) + ". " if bases else "") + \
        ("Published: " + "; ".join(sources) + "." if sources else "")


def paper_frames(runs: list[RunData], long_eval: pd.DataFrame | None, bench: dict | None,
                 flops: dict | None) -> dict[str, pd.DataFrame]:
    """{table name: paper_tables frame} for the lead section."""
    compared = released_marble(runs)
    return {"Table 1": paper_tables.table1(compared, long_eval),
            "rho ablation": paper_tables.rho_ablation(runs, long_eval),
            "Gradient harmony": paper_tables.harmony(compared),
            "Training cost": paper_tables.cost(bench, flops)}


def _separate_sides(title: str, frame: pd.DataFrame, path, toy: bool) -> list:
    """Our measured values and the published ones as two tables, when no metric has both."""
    ours, paper = paper_tables.one_side(frame, "ours"), paper_tables.one_side(frame, "published")
    what = "toy metrics of the tiny run" if toy else "our metrics"
    out = []
    if ours.empty:
        out.append(Text(f"{title}: nothing of ours measured for it (`{path}`). {_notes(frame)}"))
    else:
        out.append(Table(f"{title}, ours ({what}; `{path}`): the paper's metrics are not "
                         f"measured by these runs, so no cell compares. {_notes(frame)}", ours))
    if not paper.empty:
        out.append(Table(f"{title}, published (not measured here)", paper))
    return out


def lead_blocks(frames: dict[str, pd.DataFrame], root: Path, toy: bool, write_csv) -> list:
    """Each table (compact, with its notes), then the headline figures, then the
    toy note. `write_csv(name, frame)` saves a table's long form and returns its path."""
    blocks: list = []
    figs = []
    for title, frame in frames.items():
        slug = title.lower().replace(" ", "_")
        path = write_csv(f"paper_{slug}", frame)
        if frame.empty:  # e.g. harmony with no runs
            blocks.append(Text(f"{title}: no rows (no run to compare; `{path}` is empty)."))
            continue
        if not paper_tables.has_overlap(frame):
            # No metric has both sides (the tiny default's toy scores against the paper's
            # metrics): two tables, each saying what it holds, not "– / 0.92" cells.
            blocks += _separate_sides(title, frame, path, toy)
            continue
        label = (f"{title}{' (toy analogue)' if toy else ''}: each cell ours / published "
                 f"(`{path}`). {_notes(frame)}")
        blocks.append(Table(label, paper_tables.compact(frame)))
        written = figures.ours_vs_published(frame, root / "figures" / f"paper_{slug}.png",
                                            f"{title}: ours (blue) vs published (grey)")
        if written is not None:
            figs.append(Figure(f"{title}: ours vs published, per metric", written.relative_to(root)))
    # One per line at the page's full width: two side by side shrank each to half its size
    # and its labels past reading (issue 41: the harmony figure at 450 px).
    blocks += figs
    if toy:
        blocks.append(Text(TOY_NOTE))
    return blocks
