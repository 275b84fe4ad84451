"""The CPU-scale experiments in the main report: `claim` (results/claim) and `zoo` (results/zoo).

Each is a folder the experiment's rule wrote (marble.experiments.claim_cli: verdict.json and
figures/). The report leads with their answers: one section each, holding the verdict's
sentences, the per-reward change of every arm with its interval, the anti-aligned fractions
and the cost, as the same frames claim.md shows (marble.report.verdict_frames), and the
experiment's figures copied into the report. A folder without a verdict is one line saying
what to run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from marble.report.verdict_frames import anti_frame, change_frame, cost_frame, paired_frame, power_lines
from marble.report.loading import ReportInputError, read_json_file
from marble.report.render import Figure, Section, Table, Text

TITLES = {"claim": "The claim at CPU scale",
          "zoo": "The balancer zoo at CPU scale (the claim's statistics, every balancer)"}
FIGURES = {"change.png": "change of each reward from the initial model, 95% interval over seeds",
           "anti_aligned_vs_n.png": "anti-aligned fraction of steps against N, the paper's 80% / 0% beside it",
           "cost.png": "counted FLOPs and CPU seconds per arm"}


def experiment_section(folder: Path, report_root: Path) -> Section:
    """The report section of one experiment folder; its figures are copied under
    report_root/figures as `<folder name>_<figure>`."""
    kind = folder.name
    section = Section(TITLES.get(kind, f"Experiment `{kind}`"))
    verdict = read_json_file(folder / "verdict.json")
    if not isinstance(verdict, dict) or "sentences" not in verdict:
        section.blocks.append(Text(f"Missing: no verdict at `{folder / 'verdict.json'}`. Run "
                                   f"`snakemake -c2 {kind}` (docs/claim.md)."))
        return section
    section.blocks.append(Text(" ".join(verdict["sentences"])))
    if not verdict.get("arms"):
        return section
    seeds = ", ".join(map(str, verdict["seeds"]))
    section.blocks.append(Text(
        f"Seeds {seeds}; MARBLE = `{verdict['marble_arm']}`, weighted sum = "
        f"`{verdict['baseline_arm']}`; 95% Student-t intervals over seeds, differences paired "
        f"by seed. Change: {verdict.get('change_measure', 'see docs/claim.md')}. "
        f"From `{folder}`."))
    try:
        frames = [("change of each reward", change_frame(verdict)),
                  (f"each arm minus `{verdict['baseline_arm']}`, paired by seed", paired_frame(verdict)),
                  ("anti-aligned fraction of steps", anti_frame(verdict)),
                  ("cost", cost_frame(verdict))]
    except (KeyError, TypeError) as exc:
        raise ReportInputError(f"{folder / 'verdict.json'}: not a claim verdict ({exc!r} missing)") from exc
    for caption, frame in frames:
        section.blocks.append(Table(f"`{kind}`: {caption}", frame))
    (report_root / "figures").mkdir(parents=True, exist_ok=True)
    for name, caption in FIGURES.items():
        src = folder / "figures" / name
        if src.is_file():
            dst = report_root / "figures" / f"{kind}_{name}"
            shutil.copyfile(src, dst)
            section.blocks.append(Figure(f"`{kind}`: {caption}", dst.relative_to(report_root)))
    section.blocks.append(Text("Power: " + " ".join(line.lstrip("- ") for line in power_lines(verdict))))
    return section
