"""Every job count README.md, docs/cluster.md and docs/container.md quote ("N jobs") equals
what `snakemake -n --forceall` plans for the command the quote is about (docs/cluster.md said
97 / 72 / 52 where the dry run planned 101 / 76 / 56, the demo's 39 and 40 against 45).

A quote is tied to its dry run by what its own line names (the config file, `make demo`, ...);
a count whose line names none of them fails as unknown, so a new figure cannot go unchecked."""

from __future__ import annotations

import re
from functools import cache

import pytest
from test_workflow_lib import ROOT, copy_workflow, snakemake

DOCS = ("README.md", "docs/cluster.md", "docs/container.md")
QUOTE = re.compile(r"\b(\d+) jobs\b")
# (what the quote's line names, the dry run it quotes), first match wins: the overlay configs
# before config/paper.yaml, whose name is a prefix of theirs.
DRY_RUNS = (
    (re.compile(r"config/paper-eval\.yaml"), ("eval_only", "--configfile", "config/paper-eval.yaml")),
    (re.compile(r"config/table1\.yaml"), ("all", "--configfile", "config/table1.yaml")),
    (re.compile(r"config/paper\.yaml"), ("all", "--configfile", "config/paper.yaml")),
    # container.md's stage 4: the tiny default up to its first training (SITE_TARGET)
    (re.compile(r"up to one training"), ("results/runs/marble/train_summary.json",)),
    (re.compile(r"make demo|snakemake -c2 all|tiny default"), ("all",)),
)


def _quotes() -> list[tuple[str, int, int, tuple[str, ...] | None]]:
    out = []
    for name in DOCS:
        for number, line in enumerate((ROOT / name).read_text(encoding="utf-8").splitlines(), 1):
            for match in QUOTE.finditer(line):
                args = next((a for pattern, a in DRY_RUNS if pattern.search(line)), None)
                out.append((name, number, int(match.group(1)), args))
    return out


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    work = copy_workflow(tmp_path_factory.mktemp("counts") / "repo", config="config.yaml")

    @cache
    def total(args: tuple[str, ...]) -> int:
        proc = snakemake(["-n", "--forceall", *args], work)
        found = re.findall(r"(?m)^total\s+(\d+)\s*$", proc.stdout)
        assert found, proc.stdout[-2000:] + proc.stderr[-2000:]
        return int(found[-1])
    return total


@pytest.mark.parametrize("doc, line, quoted, args", _quotes(),
                         ids=lambda v: str(v) if isinstance(v, (str, int)) else "")
def test_each_quoted_job_count_is_the_dry_runs(planned, doc, line, quoted, args):
    assert args is not None, (f"{doc}:{line} quotes {quoted} jobs of no dry run this test knows: name the "
                              "command on that line, or add it to DRY_RUNS")
    assert quoted == planned(args), (f"{doc}:{line} says {quoted} jobs; `snakemake -n --forceall "
                                     f"{' '.join(args)}` plans {planned(args)}")
