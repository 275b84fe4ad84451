"""A dry run's price: the jobs Snakemake itself lists, priced when it closes its log.

The Snakefile cannot know at parse time which jobs a target runs and which are finished:
only the DAG does. Snakemake logs each job a dry run would start as a `job_info` event
(rule and wildcards; the logger-plugin interface, snakemake_interface_logger_plugins), and
closes every handler of its logger when it finishes. `DryRunPlan`, added to that logger by
workflow/rules/common.smk under `-n`, collects the events and, on close, prints the plan of
exactly those jobs (marble.workflow.plan_price). $MARBLE_PLAN_JSON names a file to write
the plan to as JSON as well (`marble plan --json`); $MARBLE_PLAN_BENCH a `marble bench
step` JSON to take the measured throughput from (default results/bench/step.json).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from marble.runtime.io import write_json
from marble.workflow.plan_format import format_plan, plan_json
from marble.workflow.plan_price import price

JSON_ENV, BENCH_ENV = "MARBLE_PLAN_JSON", "MARBLE_PLAN_BENCH"
DEFAULT_BENCH = "results/bench/step.json"


def _event(record: logging.LogRecord) -> str:
    event = getattr(record, "event", None)
    return str(getattr(event, "value", event or ""))


class DryRunPlan(logging.Handler):
    """Collects (rule, wildcards) of the listed jobs; `report()` runs once, on close, when
    Snakemake got as far as listing (a DAG error lists nothing and prints no plan)."""

    def __init__(self, report):
        super().__init__(logging.INFO)
        self.report, self.jobs, self.listed, self.reported = report, [], False, False

    def emit(self, record: logging.LogRecord) -> None:
        kind = _event(record)
        if kind == "job_info":
            self.jobs.append((record.rule_name, dict(getattr(record, "wildcards", None) or {})))
        elif kind == "run_info" or str(record.msg).startswith("Nothing to be done"):
            self.listed = True

    def close(self) -> None:
        try:
            if self.listed and not self.reported:
                self.reported = True
                self.report(self.jobs)
        except Exception as exc:  # Snakemake swallows a handler's errors on close: say it
            print(f"plan: not priced: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        finally:
            super().close()


def reporter(config: dict, root: Path, stream=None):
    """The report function of a workflow's dry run: print the plan of the listed jobs (and
    write its JSON where $MARBLE_PLAN_JSON says)."""
    def report(jobs: list[tuple[str, dict]]) -> None:
        bench_path = Path(os.environ.get(BENCH_ENV) or root / DEFAULT_BENCH)
        bench = json.loads(bench_path.read_text(encoding="utf-8")) if bench_path.is_file() else None
        result = price(jobs, config, root, bench)
        print(format_plan(result), file=stream or sys.stderr, flush=True)
        if os.environ.get(JSON_ENV):
            write_json(Path(os.environ[JSON_ENV]), plan_json(result))
    return report


def attach(logger: logging.Logger, config: dict, root: Path) -> DryRunPlan:
    handler = DryRunPlan(reporter(config, root))
    logger.addHandler(handler)
    return handler
