"""`marble tables NAME`: one of the paper's tables as csv + markdown + DVC metrics JSON.

    marble tables rho_ablation --runs results/runs [--eval-summary results/eval/summary.csv] --out results/tables
    marble tables harmony --runs results/runs [--only weighted_sum,rho_07] --out results/tables
    marble tables cost [--bench results/bench/step.json] [--flops results/bench/flops.json] --out results/tables
    marble tables paper_tables --inputs results/eval/table1.md results/tables/rho_ablation.md ... --out results/tables

Writes OUT/NAME.csv (long: a row per table row and metric, ours beside published, basis and
source), OUT/NAME.md (a row per table row, each cell "ours / published") and OUT/NAME.json
(DVC metrics: ours only). `paper_tables` joins the given markdown tables into one file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from marble.runtime.io import write_text

TITLES = {
    "rho_ablation": "EMA decay rho ablation",
    "harmony": "Gradient harmony (weighted sum -> MARBLE)",
    "cost": "Training cost (relative to the weighted sum)",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="marble tables", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", choices=[*TITLES, "paper_tables"])
    p.add_argument("--out", type=Path, required=True, help="folder for NAME.csv/.md/.json")
    p.add_argument("--runs", type=Path, help="folder of run folders (results/runs)")
    p.add_argument("--only", default="", help="comma-separated run names (default: every run)")
    p.add_argument("--eval-summary", type=Path, help="results/eval/summary.csv")
    p.add_argument("--eval-dir", type=Path,
                   help="instead of --eval-summary: an evaluation settings folder (<run>/<ckpt>/<dataset>)")
    p.add_argument("--bench", type=Path, help="`marble bench step` JSON")
    p.add_argument("--flops", type=Path, help="`marble bench flops` JSON")
    p.add_argument("--inputs", type=Path, nargs="*", default=[], help="paper_tables: markdown files")
    return p


def _runs(args):
    from marble.report.loading import left_out_sentence, load_complete_runs

    if args.runs is None:
        raise SystemExit(f"marble tables {args.name}: --runs is required")
    runs, left_out = load_complete_runs(args.runs)
    only = [r for r in args.only.split(",") if r]
    left_out = {n: why for n, why in left_out.items() if not only or n in only}
    if left_out:  # named, never tabulated beside finished runs
        print(f"marble tables {args.name}: {left_out_sentence(left_out)}", file=sys.stderr)
    missing = sorted(set(only) - {r.name for r in runs} - set(left_out))
    if missing:
        raise SystemExit(f"marble tables {args.name}: --only names runs with no metrics.jsonl "
                         f"under {args.runs}: {', '.join(missing)}")
    return [r for r in runs if r.name in only] if only else runs


def _json(path: Path | None):
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SystemExit(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from exc


def build(args):
    from marble.report import paper_tables as pt
    from marble.report.loading import load_eval_summary

    if args.name == "rho_ablation":
        if args.eval_dir is not None:  # only the table's own runs need evaluating
            from marble.evaluation.summary import collect

            return pt.rho_ablation(_runs(args), collect(args.eval_dir))
        return pt.rho_ablation(_runs(args), load_eval_summary(args.eval_summary))
    if args.name == "harmony":
        return pt.harmony(_runs(args))
    return pt.cost(_json(args.bench), _json(args.flops))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from marble.report.loading import ReportInputError
    from marble.runtime.oserrors import not_a_folder, print_write_failure

    problem = not_a_folder(args.out, "--out") if args.out is not None else None
    if problem:
        print(f"marble tables {args.name}: error: {problem}", file=sys.stderr)
        return 2
    try:
        return _write(args)
    except ReportInputError as exc:  # an input that is not what it says: one line, never a traceback
        print(f"marble tables {args.name}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the final writes: a full disk, an --out that is a file
        return print_write_failure(f"marble tables {args.name}", exc, args.out)


def _write(args) -> int:
    if args.name == "paper_tables":
        missing = [str(p) for p in args.inputs if not p.is_file()]
        if missing:
            raise SystemExit(f"marble tables paper_tables: no such file: {', '.join(missing)}")
        parts = [p.read_text(encoding="utf-8").rstrip() for p in args.inputs]
        write_text(args.out / "paper_tables.md", "# The paper's tables, ours beside them\n\n"
                   + "\n\n".join(parts) + "\n")
        print(f"wrote {args.out / 'paper_tables.md'}")
        return 0
    from marble.runtime.io import write_json
    from marble.report import paper_tables as pt

    frame = build(args)
    args.out.mkdir(parents=True, exist_ok=True)
    write_text(args.out / f"{args.name}.csv", frame.to_csv(index=False))
    write_text(args.out / f"{args.name}.md", pt.wide_markdown(frame, TITLES[args.name]))
    write_json(args.out / f"{args.name}.json", pt.metrics_json(frame))
    print(f"wrote {args.out}/{args.name}.csv, .md, .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
