"""Issue 47 item 3: every figure of docs/claim.md's main-run answer recomputes from files in the
repository. The main run's per-seed file (docs/claim_per_seed.json) gives the headline
(marble.experiments.claim_per_seed), which equals the committed verdict (docs/claim_verdict.json)
section by section, and its table is quoted verbatim in docs/claim.md. The pilot and the rules
were committed before the main run's files (git history, where the checkout has it)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from marble.experiments.claim_markdown import headline_markdown
from marble.experiments.claim_per_seed import headline

DOCS = Path("docs")
PER_SEED, VERDICT, PILOT = DOCS / "claim_per_seed.json", DOCS / "claim_verdict.json", DOCS / "claim_pilot.json"


@pytest.fixture(scope="module")
def committed():
    per_seed = json.loads(PER_SEED.read_text(encoding="utf-8"))
    return headline(per_seed), json.loads(VERDICT.read_text(encoding="utf-8"))


def test_the_verdict_recomputes_from_the_per_seed_file(committed):
    head, verdict = committed
    for key in ("seeds", "arms", "questions", "levels", "noise", "arms_versus_baseline"):
        assert head[key] == verdict[key], key
    assert head["replication"] == verdict["replication"]["status"]
    assert head["b_equivalence"] == verdict["multiplicity"]["b_equivalence"]


def test_claim_md_quotes_the_recomputed_table_and_the_pre_registered_design(committed):
    head, verdict = committed
    assert headline_markdown(head) in (DOCS / "claim.md").read_text(encoding="utf-8")
    claim = yaml.safe_load(open("config.yaml", encoding="utf-8"))["claim"]
    assert verdict["seeds"] == claim["seeds"]  # the seeds the pilot fixed
    assert set(verdict["arms"]) >= set(claim["arms"])
    assert all(m["cpu_model"] for m in verdict["machine"]["machines"])  # item 5: the machine


def _first_commit(path: Path) -> str | None:
    out = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--", str(path)],
                         capture_output=True, text=True)
    lines = out.stdout.split()
    return lines[-1] if out.returncode == 0 and lines else None


def test_the_pilot_and_rules_were_committed_before_the_main_runs_files():
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], capture_output=True, text=True)
    main_run, pilot = _first_commit(VERDICT), _first_commit(PILOT)
    if shallow.stdout.strip() != "false" or main_run is None or pilot is None:
        pytest.skip("no whole git history here (an exported tree or a shallow clone)")
    before = subprocess.run(["git", "merge-base", "--is-ancestor", pilot, main_run])
    assert before.returncode == 0 and pilot != main_run
