"""The preflight gate: every job of every target waits for `marble doctor` (rule `preflight`).

Three pieces, bound by the Snakefile:
- `sync_snapshot`: the resolved configuration (every --configfile merged, --config applied,
  schema defaults filled) and the --configfile list, written as canonical JSON, rewritten only
  when it changes. It is the preflight rule's input and what the doctor reads (`marble doctor
  --snapshot`), so a changed configuration reruns the doctor, an unchanged one keeps its
  mtime (no rerun), and the rule has no params: a params change is a Snakemake rerun trigger
  even in a dry run, where it would hide the whole plan behind the due checkpoint.
- `ensure_gate`: when the preflight's output is missing, a new request (the preflight's
  other input) and a placeholder dated a second before it, so the preflight still runs but
  finished jobs are not rerun for it (their gate input is `ancient`: an existing gate file
  never makes a job outdated).
- `gate_rules`: appends the gate as a named input of every rule but the preflight. It runs
  after every include, so a rule added later is gated without naming the preflight. The
  preflight is a Snakemake checkpoint and the gate an input function reading its output:
  while it must run, no other job can be scheduled (a failed preflight leaves nothing
  downloaded or queued), and once it has passed Snakemake re-evaluates the DAG, so each job's
  own reasons to run (missing output, changed params) count. A plain ancient file input
  would not do: Snakemake skips the needrun check of every job downstream of a job that
  runs, and an ancient input then never makes them run (a file target was left unplanned).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from marble.workflow.slurm_capacity import TARGET_JOBS, named_targets

GATE_INPUT = "preflight"  # the name of the gate input in every gated rule
PLACEHOLDER = "preflight not run yet (marble.workflow.preflight.ensure_gate)\n"


def snapshot_text(config: dict, configfiles: Iterable = (), targets: Iterable = ()) -> str:
    """The resolved configuration, the --configfile list and the named targets as canonical
    JSON (sorted keys: a reordered file is no change). The targets decide which SLURM jobs the
    doctor checks (marble.workflow.slurm_capacity.TARGET_JOBS); none: the key is left out."""
    data = {"config": config, "configfiles": [str(f) for f in configfiles]}
    if targets:
        data["targets"] = sorted(str(t) for t in targets)
    return json.dumps(data, sort_keys=True, indent=1, default=str) + "\n"


def snapshot_targets(path: str | Path) -> list[str]:
    """The targets a snapshot names ([] when none: the doctor then checks every job)."""
    try:
        return [str(t) for t in json.loads(Path(path).read_text(encoding="utf-8")).get("targets") or []]
    except (OSError, ValueError, AttributeError):
        return []


def read_snapshot(path: str | Path) -> tuple[dict, list[str]]:
    """(resolved config, --configfile list) of a snapshot; ValueError naming the file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return dict(data["config"]), [str(f) for f in data["configfiles"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a preflight snapshot ({exc})") from None


def wanted_text(path: str | Path, config: dict, configfiles: Iterable = (), targets: Iterable = ()) -> str:
    """The snapshot this invocation needs. Same configuration and a target whose SLURM jobs
    the doctor already checked (`eval_only` after `all`): the stored text, kept as it is (a
    rewrite would rerun the doctor for nothing). A target with jobs not checked yet: the
    targets of both, so the doctor runs again and checks them all."""
    text = snapshot_text(config, configfiles, targets)
    try:
        stored = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return text
    before = named_targets(stored.pop("targets", None) or [])
    if json.dumps(stored, sort_keys=True, indent=1, default=str) + "\n" != snapshot_text(config, configfiles):
        return text  # the configuration changed: the doctor checks this target's jobs

    def jobs(names):  # no named target: every job (`all`)
        return set().union(*(TARGET_JOBS[t] for t in names)) if names else set(TARGET_JOBS["all"])

    new = named_targets(targets)
    if jobs(new) <= jobs(before):
        return Path(path).read_text(encoding="utf-8")
    return snapshot_text(config, configfiles, sorted(set(before) | set(new)) if new else ())


def sync_snapshot(path: str | Path, config: dict, configfiles: Iterable = (), targets: Iterable = ()) -> bool:
    """Write the snapshot atomically when its text changed; True when it was written."""
    path = Path(path)
    text = wanted_text(path, config, configfiles, targets)
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return False
    _write(path, text)
    return True


def ensure_gate(path: str | Path, request: str | Path) -> bool:
    """When the gate file is missing: a new `request` (a nonce) and a placeholder gate a second
    older than it; True when made. The request is the preflight's second input: Snakemake
    skips an input whose checksum matches its record, so an unchanged config alone would not
    rerun a doctor whose output is gone (failed, deleted). Not mtime 0: Snakemake takes that
    for "no time".

    Without the placeholder a missing gate file would make every finished job outdated
    (Snakemake reruns a job whose input is produced by a job that runs, unless that input is
    ancient *and* exists): deleting results/preflight.txt must not redownload or retrain.
    """
    path, request = Path(path), Path(request)
    if path.exists() and request.exists():
        return False
    _write(request, f"{time.time_ns()} {os.getpid()}\n")
    if path.exists():
        return False
    stamp = request.stat().st_mtime - 1
    _write(path, PLACEHOLDER, mtime=stamp)
    return True


def _write(path: Path, text: str, mtime: float | None = None) -> None:
    """Atomic: a temporary beside the file, then a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    if mtime is not None:
        os.utime(tmp, (mtime, mtime))
    os.replace(tmp, path)


# Command lines that plan, draw or touch but run no job: they never make the doctor due.
NON_EXECUTING = {"--touch", "-t", "--lint", "--dag", "--rulegraph", "--filegraph", "--d3dag",
                 "--summary", "-S", "--detailed-summary", "-D", "--list-rules", "-l", "--unlock",
                 "--list-target-rules", "--lt", "--report", "--containerize", "--cleanup-metadata",
                 "--list-changes", "--lc", "--print-compilation"}


def executes(argv: list[str], dry_run: bool) -> bool:
    """Whether this Snakemake invocation runs jobs (not -n, --touch, --dag, ...)."""
    return not dry_run and not NON_EXECUTING.intersection(a.split("=", 1)[0] for a in argv)


def prepare_gate(gate: str | Path, snapshot: str | Path, request: str | Path, config: dict,
                 execute: bool, configfiles: Iterable = (), targets: Iterable = ()) -> str | None:
    """Bind the gate's files for one invocation; the reason the doctor is due, or None.

    execute (a run): the snapshot follows the config, a missing or placeholder gate renews
    the request, so the preflight checkpoint runs first. Otherwise (a dry run, a DAG drawing,
    `--touch`) nothing is made due: missing inputs are written dated a day back and a missing
    gate as a placeholder newer than them. A due checkpoint would hide the whole plan ("DAG of
    jobs will be updated"); the next run still runs the doctor (the placeholder says so).
    """
    gate, snapshot, request = Path(gate), Path(snapshot), Path(request)
    placeholder = gate.is_file() and gate.read_text(encoding="utf-8", errors="replace") == PLACEHOLDER
    text = wanted_text(snapshot, config, configfiles, targets)
    changed = not snapshot.is_file() or snapshot.read_text(encoding="utf-8") != text
    reason = ("it has not passed here yet" if not gate.exists() or placeholder
              else "the configuration changed since it passed" if changed else None)
    if execute:
        sync_snapshot(snapshot, config, configfiles, targets)
        if placeholder:
            gate.unlink()
        ensure_gate(gate, request)
        return reason
    old = time.time() - 86400
    if not snapshot.is_file():
        _write(snapshot, text, mtime=old)
    if not request.is_file():
        _write(request, f"{time.time_ns()} {os.getpid()}\n", mtime=old)
    if not gate.exists():
        _write(gate, PLACEHOLDER)
    return reason


def gate_rules(
    rules: Iterable, preflight_rule: str, gate_file: Callable, path_modifier
) -> list[str]:
    """Add `gate_file()` (a new `ancient(...)` path per rule: Snakemake annotates the string
    it is given) to the input of every rule but the preflight.

    rules: Snakemake's Rule objects (`workflow.rules`); path_modifier: the workflow's
    (`workflow.modifier.path_modifier`), which Snakemake sets only on rules that declared an
    input (a target rule like `cost` may have none). Returns the names of the gated rules.
    """
    gated = []
    for rule in rules:
        if rule.name == preflight_rule:
            continue
        if rule.input_modifier is None:
            rule.input_modifier = path_modifier
        rule.set_input(**{GATE_INPUT: gate_file()})
        gated.append(rule.name)
    return gated


def ungated_jobs(dot: str, preflight_rule: str = "preflight") -> list[str]:
    """Rules of the jobs in a `snakemake --dag` graph without an edge from the preflight job.

    Used by the tests (tests/test_preflight.py) on every target's DAG.
    """
    labels, edges = {}, set()
    for line in dot.splitlines():
        line = line.strip()
        if "->" in line:
            src, dst = (part.strip().rstrip(";") for part in line.split("->", 1))
            edges.add((src, dst))
        elif "[label" in line:
            node = line.split("[", 1)[0].strip()
            label = line.split('label = "', 1)[1].split('"', 1)[0] if 'label = "' in line else ""
            labels[node] = label.split("\\n", 1)[0]
    pre = {node for node, name in labels.items() if name == preflight_rule}
    return sorted(
        name
        for node, name in labels.items()
        if name != preflight_rule and not any((p, node) in edges for p in pre)
    )

