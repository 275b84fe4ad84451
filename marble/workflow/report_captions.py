"""The captions of the report's figures and tables in `snakemake --report` (torch-free).

Each figure `results/report/figures/<name>.png` and table `results/report/tables/<name>.csv`
that `marble report` writes has a caption `workflow/report/{figures,tables}/<kind>.rst`,
where `<kind>` is the name itself, or for one of a family written once per run or group
(`samples_<run>`, `rho_ablation_<i>`) the family's prefix. report.smk registers both
folders with `report(..., patterns=..., caption=...)`; the caption templates
(workflow/report/figure.rst, table.rst) pick the text with the same rule as `caption_kind`.
"""

from __future__ import annotations

from pathlib import Path

CAPTION_DIR = Path("workflow/report")
# The report's folders -> the suffix of their files (marble.report.build.Builder).
FOLDERS = {"figures": ".png", "tables": ".csv"}


def captions(root: str | Path = ".") -> dict[str, dict[str, str]]:
    """{"figures": {kind: caption text}, "tables": {...}}, longest kind first (so the
    templates' first prefix match is the most specific one)."""
    out = {}
    for folder in FOLDERS:
        files = sorted((Path(root) / CAPTION_DIR / folder).glob("*.rst"),
                       key=lambda p: (-len(p.stem), p.stem))
        out[folder] = {p.stem: p.read_text(encoding="utf-8").strip() for p in files}
    return out


def caption_kind(name: str, kinds: dict[str, str]) -> str | None:
    """The caption kind of a report file stem: itself, else its longest `<kind>_` prefix."""
    if name in kinds:
        return name
    matches = [kind for kind in kinds if name.startswith(f"{kind}_")]
    return max(matches, key=len) if matches else None


def uncaptioned(report_dir: str | Path, root: str | Path = ".") -> list[str]:
    """The figures and tables under `report_dir` without a caption (relative paths)."""
    known = captions(root)
    missing = []
    for folder, suffix in FOLDERS.items():
        for path in sorted((Path(report_dir) / folder).glob(f"*{suffix}")):
            if caption_kind(path.stem, known[folder]) is None:
                missing.append(f"{folder}/{path.name}")
    return missing
