"""The report, the pipeline's last stage: tables, figures, Markdown and self-contained HTML from run folders,
the eval summary and the bench JSON. Every input but --runs is optional; a missing one
gives a section saying what is missing and how to make it."""

from marble.report.build import ReportInputs, build_report

__all__ = ["ReportInputs", "build_report"]
