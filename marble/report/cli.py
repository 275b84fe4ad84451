"""`marble report` (= `python -m marble.report`): tables, figures, Markdown and self-contained HTML from run folders,
the eval summary and the bench JSON. Every input but --runs is optional; a missing one
gives a section saying what is missing and how to make it.

`marble report summary [FOLDER]`: where a built report is and its verdict in one line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from marble.report.build import ReportInputs, build_report
from marble.report.glance import summary_line
from marble.report.loading import ReportInputError, left_out_sentence
from marble.runtime.oserrors import print_write_failure


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="marble report", description=__doc__)
    p.add_argument("--runs", type=Path, required=True, help="folder of run folders (results/runs)")
    p.add_argument("--out", type=Path, required=True, help="report folder (results/report)")
    p.add_argument("--eval-summary", type=Path, help="results/eval/summary.csv")
    p.add_argument("--bench", type=Path, help="results/bench/step.json")
    p.add_argument("--flops", type=Path, help="`marble bench flops` JSON (counted FLOPs)")
    p.add_argument("--eval-dir", type=Path, help="results/eval (sample images)")
    p.add_argument("--table1", type=Path, help="results/eval/table1.csv (every Table 1 row)")
    p.add_argument("--experiment", type=Path, action="append", default=[],
                   help="a CPU-scale experiment folder (results/claim, results/zoo): its section "
                        "leads the report; repeatable")
    p.add_argument("--images-per-dataset", type=int, default=4)
    p.add_argument("--window", type=int, default=None,
                   help="epochs averaged at each end for the verdict (default: a quarter, 1..5)")
    p.add_argument("--min-gain", type=float, default=0.0,
                   help="a reward counts as improving when its change exceeds this")
    p.add_argument("--smooth", type=int, default=5, help="moving-average window of the curves")
    return p


def summary(argv: list[str]) -> int:
    """Print the report's path and the verdict's one-line summary (`make demo` ends with it)."""
    p = argparse.ArgumentParser(prog="marble report summary", description=summary.__doc__)
    p.add_argument("folder", type=Path, nargs="?", default=Path("results/report"),
                   help="a report folder (`marble report --out`; default results/report)")
    folder = p.parse_args(argv).folder
    path = folder / "verdict.json"
    try:
        verdict = json.loads(path.read_text(encoding="utf-8"))
        line = summary_line(verdict)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"marble report summary: {path}: no readable verdict ({exc.__class__.__name__}: {exc}); "
              "build the report first (`snakemake -c2 all` or `marble report --runs ... --out "
              f"{folder}`)", file=sys.stderr)
        return 1
    print(f"report: {(folder / 'report.html').resolve()}")
    print(f"verdict: {line}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["summary"]:
        return summary(argv[1:])
    args = _parser().parse_args(argv)
    try:
        result = build_report(ReportInputs(
            runs_dir=args.runs, out=args.out, eval_summary=args.eval_summary, bench=args.bench,
            flops=args.flops, eval_dir=args.eval_dir, table1=args.table1,
            images_per_dataset=args.images_per_dataset, window=args.window,
            min_gain=args.min_gain, smooth=args.smooth, experiments=tuple(args.experiment),
        ))
    except (ReportInputError, FileExistsError) as exc:  # an input, or an --out it must not replace
        print(f"marble report: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the final write: a full disk, a read-only folder (nothing was replaced)
        return print_write_failure("marble report", exc, args.out, suffix="; nothing was written")
    print(f"wrote {args.out / 'report.md'} and {args.out / 'report.html'}")
    print(f"verdict: {summary_line(result)}")
    if result.get("runs_left_out"):
        print(left_out_sentence(result["runs_left_out"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
