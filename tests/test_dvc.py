"""DVC over the Snakemake workflow: dvc.yaml agrees with the Snakefile, `dvc repro`
reproduces the tiny tables and a second one does nothing, metrics are declared, and a
local-folder remote round trip restores every output."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from test_workflow_lib import (  # noqa: F401  (tiny_pipeline is a fixture)
    copy_workflow,
    dry_run_outputs,
    dvc,
    snakemake,
    tiny_pipeline,
)
from test_workflow_lib import run as run_cmd

from marble.workflow import dvc_sync
from marble.workflow import configs


def _render(value, variables: dict):
    """DVC's `${a.b}` interpolation, enough for our dvc.yaml."""
    def lookup(match):
        node = variables
        for part in match.group(1).split("."):
            node = node[part]
        return str(node)
    if isinstance(value, str):
        return re.sub(r"\$\{([^}]+)\}", lookup, value)
    if isinstance(value, list):
        return [_render(v, variables) for v in value]
    if isinstance(value, dict):
        return {_render(k, variables): _render(v, variables) for k, v in value.items()}
    return value


def _paths(entries) -> list[str]:
    return [next(iter(e)) if isinstance(e, dict) else e for e in entries]


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _rule_graph(work: Path, targets: list[str]) -> dict[str, set[str]]:
    """{rule: the rules it needs, transitively}, from one `snakemake --rulegraph`."""
    dot = snakemake(["--rulegraph", "--forceall", *targets], work).stdout
    names = dict(re.findall(r'^\s*(\d+)\[label = "([^"]+)"', dot, re.M))
    needs: dict[str, set[str]] = {n: set() for n in names.values()}
    for src, dst in re.findall(r"^\s*(\d+) -> (\d+)", dot, re.M):
        needs[names[dst]].add(names[src])
    # The rule graph merges every job of a rule into one node, so it can cycle where the job
    # DAG does not (folder_digest digests the raw prompts before pretraining and the model it
    # wrote after): a walk with a visited set, not a recursion.
    def closure(rule: str) -> set[str]:
        seen, todo = set(), [rule]
        while todo:
            for r in needs[todo.pop()] - seen:
                seen.add(r)
                todo.append(r)
        return seen
    return {rule: closure(rule) | {rule} for rule in needs}


def test_dvc_stages_match_snakefile(tmp_path):
    """Each stage runs one Snakemake target; its outs hold exactly the files that target
    adds to the previous stages; data deps are upstream outs; params are config keys."""
    work = copy_workflow(tmp_path / "repo", config=None)
    config = yaml.safe_load((work / "config.yaml").read_text())
    params = yaml.safe_load((work / "params.yaml").read_text())
    spec = yaml.safe_load((work / "dvc.yaml").read_text())
    assert spec["vars"] == ["config.yaml", "params.yaml"]
    stages = _render(spec["stages"], {**config, **params})
    targets = list(dvc_sync.stage_targets({"stages": stages}).values())
    graph = _rule_graph(work, targets + ["all"])
    rule_outputs = dry_run_outputs(work, "all", extra=targets)  # one dry run, every target
    schema = yaml.safe_load((work / "workflow/schemas/config.schema.yaml").read_text())
    shipped_configs = [configs.load([f], work)
                       for f in ["config.yaml", ".test/config.yaml", "config/paper.yaml"]]
    produced: set[str] = set()
    upstream_outs: list[str] = []
    for name, stage in stages.items():
        words = stage["cmd"].split()
        # The wrapper that touches the upstream stages' targets first (dvc_sync).
        assert words[:6] == ["python", "-m", "marble.workflow.dvc_sync", "stage", name, "--"]
        cmd = words[6:]
        assert cmd[0] == "snakemake" and "-c2" in cmd, stage["cmd"]
        assert cmd[cmd.index("--profile") + 1] == "workflow/profiles/local", stage["cmd"]
        target = cmd[1]  # first: --rerun-triggers takes several values
        assert target in graph, f"stage {name} runs `{target}`, not a rule of the Snakefile"
        # results/digests/: the Snakefile's content stamps of input folders (marble.workflow.
        # digests), bookkeeping like .snakemake/ that any checkout rebuilds; DVC hashes the
        # folders themselves, so no stage versions them.
        outputs = {o for o in set().union(*(rule_outputs.get(r, set()) for r in graph[target])) - produced
                   if not _under(o, "results/digests")}
        outs = _paths(stage["outs"])
        for out in sorted(outputs):
            assert any(_under(out, o) for o in outs), f"stage {name}: {out} is in no DVC out {outs}"
        for out in outs:
            assert any(_under(o, out) for o in outputs), f"stage {name}: out {out} holds no output of `{target}`"
        for dep in stage["deps"]:
            if (work / dep).exists():
                continue  # code: Snakefile, rules, scripts, marble/
            assert any(_under(dep, o) for o in upstream_outs), f"stage {name}: dep {dep} is nobody's out"
        for entry in stage.get("params", []):
            for file, keys in entry.items():
                assert file == "config.yaml"
                for key in keys:
                    assert key.split(".")[0] in schema["properties"], f"stage {name}: param {key}"
                    # DVC reads the raw file: the key must be written out, not defaulted.
                    for shipped in shipped_configs:
                        assert key in shipped, f"stage {name}: param {key} missing from a shipped config"
        produced |= outputs
        upstream_outs += outs
    everything = {o for o in set().union(*(rule_outputs.get(r, set()) for r in graph["all"]))
                  if not _under(o, "results/digests")}
    assert everything and everything <= produced, f"`all` makes files no stage declares: {everything - produced}"
    persisted = [e for e in stages["train"]["outs"] if isinstance(e, dict)]
    assert persisted and all(next(iter(e.values()))["persist"] for e in persisted)


def _tree_sha(path: Path) -> dict[str, str]:
    """{relative file: sha256} of a file or a folder's files."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {p.relative_to(path).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _lock_outs(work: Path) -> list[str]:
    """Every out path dvc.lock records, over all stages."""
    lock = yaml.safe_load((work / "dvc.lock").read_text())
    return sorted({out["path"] for stage in lock["stages"].values() for out in stage.get("outs", [])})


def _views():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "workflow/scripts/dvc_views.py"
    spec = importlib.util.spec_from_file_location("dvc_views", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dvc_views_flat_tables_curves_and_bars(tmp_path):
    views = _views()
    runs = tmp_path / "runs"
    for run, values in {"marble": [0.25, float("nan"), 0.75], "weighted_sum": [0.5, 0.5, 0.5]}.items():
        (runs / run).mkdir(parents=True)
        lines = [json.dumps({"step": i + 1, "reward/toy_a": v, "balancer": run})
                 for i, v in enumerate(values)]
        (runs / run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    summary = tmp_path / "summary.csv"
    summary.write_text("run,checkpoint,dataset,metric,value\n"
                       "marble,checkpoint-000004,pickscore,toy_a,0.5\n"
                       "marble,checkpoint-000004,pickscore,n_toy_a,3\n"
                       "weighted_sum,checkpoint-000004,pickscore,toy_a,\n")
    bench = tmp_path / "step.json"
    bench.write_text(json.dumps({"balancers": {"weighted_sum": {"step_s": 2.0, "peak_mb": 10},
                                               "marble": {"step_s": 3.0, "peak_mb": 12}}}))
    out = tmp_path / "dvc"
    (out / "curves").mkdir(parents=True)
    (out / "curves" / "stale.csv").write_text("a reward that is gone\n")
    views.write_views(runs, summary, bench, out)
    metrics = json.loads((out / "eval_metrics.json").read_text())
    assert metrics == {"marble/checkpoint-000004": {"toy_a (pickscore)": 0.5},
                       "weighted_sum/checkpoint-000004": {"toy_a (pickscore)": None}}
    assert json.loads((out / "bench_metrics.json").read_text())["marble"]["time_vs_weighted_sum"] == 1.5
    assert sorted(p.name for p in (out / "curves").iterdir()) == ["toy_a.csv"]
    curve = (out / "curves/toy_a.csv").read_text().splitlines()
    assert curve[:4] == ["step,value,run", "1,0.25,marble", "2,,marble", "3,0.75,marble"]
    bars = (out / "eval_bars/toy_a_pickscore.csv").read_text().splitlines()
    assert bars == ["run,value", "marble/checkpoint-000004,0.5", "weighted_sum/checkpoint-000004,"]
    # Table 1's metrics file is always declared, so always written ({} without a Table 1).
    assert json.loads((out / "table1_metrics.json").read_text()) == {}
    table1 = tmp_path / "table1.json"
    table1.write_text(json.dumps({"+ MARBLE": {"OCR": 0.9, "Composite": 1.0}}))
    views.write_views(runs, summary, bench, out, table1)
    assert json.loads((out / "table1_metrics.json").read_text()) == {"+ MARBLE": {"OCR": 0.9, "Composite": 1.0}}


@pytest.mark.slow
def test_dvc_repro_twice_metrics_and_plots(tiny_pipeline):
    work = tiny_pipeline["dir"]
    assert (work / "dvc.lock").is_file()
    again = dvc(["repro"], work)
    text = again.stdout + again.stderr
    assert "Running stage" not in text, text[-2000:]
    assert "up to date" in dvc(["status"], work).stdout
    shown = dvc(["metrics", "show"], work)
    assert "ERROR" not in shown.stdout + shown.stderr and "eval_metrics.json" in shown.stdout
    metrics = json.loads(dvc(["metrics", "show", "--json"], work).stdout)
    flat = json.dumps(metrics)
    assert "error" not in flat and "toy_brightness (pickscore)" in flat and "step_s" in flat
    plots = json.loads(dvc(["plots", "show", "--json"], work).stdout)["data"]
    curves = [k for k in plots if k.startswith("results/dvc/curves/")]
    bars = [k for k in plots if k.startswith("results/dvc/eval_bars/")]
    assert "results/dvc/curves/toy_brightness.csv" in curves and bars, sorted(plots)
    values = plots[curves[0]][0]["content"]["data"]["values"]
    runs = yaml.safe_load((work / "config.yaml").read_text())["runs"]
    assert {v["run"] for v in values} == set(runs)
    # The round trip through a local-folder remote is the clean-clone test's (below): its
    # pull into a clone without cache or outputs restores every tracked output byte for byte.


@pytest.mark.slow
def test_dvc_exp_with_another_balancer_runs_only_affected_stages(tiny_pipeline, tmp_path):
    """A run with another balancer added through `dvc exp run -S`: prepare is not rerun,
    the new run is trained and evaluated, the others are not retrained, and
    `dvc params diff` names the change."""
    work = tmp_path / "exp"  # a copy: the shared pipeline folder stays as the fixture left it
    shutil.copytree(tiny_pipeline["dir"], work, symlinks=True)
    done = work / "results/runs/marble/train_summary.json"
    before = done.read_text()
    # Up to `report` (whose dvc_views write the metrics read below): the paper-table stages
    # after it only reformat results and nothing here reads them; the fixture's `dvc repro`
    # runs every stage and the test above checks a second one runs none (65 s of 275 s here).
    proc = dvc(["exp", "run", "-S",
                "config.yaml:+runs.mgda={preset:tiny_mgda,max_steps:2,set:['train.save_every=2']}",
                "report"],
               work, timeout=1500)
    text = proc.stdout + proc.stderr
    assert "Running stage 'prepare'" not in text and "Stage 'prepare' didn't change" in text
    assert "Running stage 'train'" in text and "Running stage 'evaluate'" in text
    assert (work / "results/runs/mgda/train_summary.json").is_file()
    why = [line for line in text.splitlines() if "reason" in line.lower() or "rule train_run" in line
           or "wildcards" in line]
    assert done.read_text() == before, why  # Snakemake's reasons, if marble was retrained
    diff = dvc(["params", "diff"], work).stdout
    assert "runs.mgda" in diff and "tiny_mgda" in diff
    metrics = json.loads((work / "results/dvc/eval_metrics.json").read_text())
    assert any(key.startswith("mgda/") for key in metrics)


def _snakemake_plan(work: Path, target: str) -> list[str]:
    """The jobs `snakemake -n <target>` (the stages' triggers) would run."""
    out = snakemake(["-n", target, *dvc_sync.TRIGGERS], work).stdout
    return [line.strip() for line in out.splitlines()
            if line.strip().startswith(("rule ", "localrule ")) and line.strip().endswith(":")]


@pytest.mark.slow
def test_restore_on_a_clean_clone_plans_nothing_and_eval_exp_only_evaluates(tiny_pipeline, tmp_path):
    """Push the tiny pipeline to a local remote; a clean clone (no outputs, no Snakemake
    metadata) pulls it. `dvc repro` and, after `dvc_sync restored`, `snakemake -n all` plan
    nothing; `dvc exp run -S eval.limit=2` runs only evaluation (and the report after it),
    no pretraining or training, whatever order the pull wrote the files in."""
    origin = tmp_path / "origin"
    shutil.copytree(tiny_pipeline["dir"], origin, symlinks=True)
    remote = tmp_path / "remote"
    dvc(["remote", "add", "-d", "local", str(remote)], origin)
    dvc(["push"], origin)
    clone = tmp_path / "clone"
    dropped = {origin / name for name in ["data", "results", "logs", "benchmarks", ".snakemake",
                                          ".dvc/cache", ".dvc/tmp"]}
    shutil.copytree(origin, clone, symlinks=True,  # what a git clone has: no outputs, no metadata
                    ignore=lambda folder, names: [n for n in names if Path(folder) / n in dropped])
    dvc(["pull"], clone)
    # Every output DVC tracks comes back from the remote byte for byte (the lock's outs).
    tracked = _lock_outs(origin)
    assert {"results/eval", "results/report", "data/datasets/tiny"} <= set(tracked)
    for out in tracked:
        assert _tree_sha(clone / out) == _tree_sha(origin / out), out
    assert (clone / ".dvc/plots/by_run.json").is_file()  # committed, not cache
    runs = sorted((clone / "results/runs").glob("*/train_summary.json"))
    before = {p: p.read_bytes() for p in runs + sorted((clone / "results/runs").glob("*/metrics.jsonl"))}
    assert runs
    repro = dvc(["repro"], clone)
    assert "Running stage" not in repro.stdout + repro.stderr
    print("plan after dvc pull, before dvc_sync:", _snakemake_plan(clone, "all"))
    run_cmd([sys.executable, "-m", "marble.workflow.dvc_sync", "restored"], clone)
    plan = _snakemake_plan(clone, "all")
    print("plan after dvc_sync restored:", plan)
    assert plan == [], plan
    assert "up to date" in dvc(["status"], clone).stdout  # touching changed no content
    # Up to `report`, the stage after evaluation: the paper-table stages only reformat
    # results (checked up to date after the pull above, and run by the fixture).
    proc = dvc(["exp", "run", "-S", "config.yaml:eval.limit=2", "report"], clone, timeout=1500)
    text = proc.stdout + proc.stderr
    assert "Running stage 'evaluate'" in text, text[-3000:]
    assert "Running stage 'prepare'" not in text and "Running stage 'train'" not in text
    jobs = re.findall(r"^\s*(?:local)?rule (\w+):", text, re.M)
    print("jobs run by the exp:", sorted(set(jobs)))
    upstream = {"make_tiny_prompts", "pretrain_tiny_model", "tiny_reward_ckpts", "assemble_split",
                "embed_prompts", "train_run"}  # the prepare and train stages' rules
    assert jobs and not upstream & set(jobs), jobs
    assert {p: p.read_bytes() for p in before} == before
