"""`make test-paper`: the paper workflow, sizes shrunk, from nothing, against the local mirror.

Builds the mirror (data/mirror), serves it on a loopback port (stops by itself when idle),
points every download at it (HF_ENDPOINT, MARBLE_MIRROR, MARBLE_MANIFEST; a stand-in
HF_TOKEN for the gated repo), writes the replicas' scorer options for evaluation
(MARBLE_REWARD_OPTIONS: HPS's tiny architecture, GenEval's stand-in detector), downloads the
replicas (the download rules' folders, so the preflight's disk estimate measures them), then runs
    snakemake --configfile config/paper.yaml .test/paper-mini.yaml -c2 all
(the workflow starts the fake UnifiedReward judge beside each drawbench evaluation through
marble.rewards.service, as it starts the real one). It then checks that every evaluation ran
with eval.processes torchrun ranks, and prints each stage's wall time (Snakemake's benchmark
files); on failure it names the failing stage (rule) and its log, and prints the log's tail.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

from beds.mirror import build_mirror, is_current, replica_reward_options
from beds.mirror_server import MirrorServer
from marble.workflow.doctor_checks import merge

CONFIGS = ("config/paper.yaml", ".test/paper-mini.yaml")
ERROR = re.compile(r"Error in rule (?P<rule>[\w.]+):")
LOG = re.compile(r"^\s*log: (?P<log>\S+)", re.M)


def failed_stages(output: str) -> list[tuple[str, str | None]]:
    """(rule, log path) for every `Error in rule` block of Snakemake's output."""
    out = []
    for match in ERROR.finditer(output):
        block = output[match.end() : match.end() + 2000]
        nxt = ERROR.search(block)
        log = LOG.search(block[: nxt.start()] if nxt else block)
        out.append((match["rule"], log["log"] if log else None))
    return out


def tail(path: str | None, lines: int = 25) -> str:
    if not path or not Path(path).is_file():
        return ""
    return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])


def stage_times(root: str | Path = "benchmarks") -> list[tuple[str, float]]:
    """(stage, wall seconds) from Snakemake's benchmark TSVs (`s` column), slowest first."""
    out = []
    for tsv in sorted(Path(root).rglob("*.tsv")):
        lines = tsv.read_text().splitlines()
        if len(lines) >= 2 and lines[0].split("\t")[0] == "s":
            out.append((tsv.relative_to(root).with_suffix("").as_posix(), float(lines[1].split("\t")[0])))
    return sorted(out, key=lambda item: -item[1])


def eval_world_sizes(root: str | Path = "results/eval", since: float = 0.0) -> dict[str, int | None]:
    """{evaluation folder: the number of ranks it ran with}, from every run_info.json written
    at or after `since` (this invocation's evaluations, not an earlier `make demo`'s)."""
    out = {}
    for info in sorted(Path(root).rglob("run_info.json")):
        if info.stat().st_mtime >= since:
            out[info.parent.as_posix()] = json.loads(info.read_text()).get("world_size")
    return out


def rank_problems(sizes: dict[str, int | None], expected: int) -> list[str]:
    """Problems, empty when every evaluation in `sizes` ran with `expected` ranks."""
    return [f"{folder}: world_size {n}, expected {expected} (eval.processes)"
            for folder, n in sizes.items() if n != expected]



def merged_config(configs: list[str]) -> dict:
    merged: dict = {}
    for path in configs:
        merge(merged, yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {})
    return merged


def foreign_runs(config: dict, runs_dir: str | Path = "results/runs") -> list[str]:
    """Run folders this configuration would train into that hold another configuration's run
    (another preset or base model: `make demo`'s tiny runs share the names weighted_sum and
    equal_alpha). Training would refuse each after minutes of downloads and embedding; the
    harness says so first, and never moves or deletes a user's results itself."""
    out = []
    for name, run in (config.get("runs") or {}).items():
        saved = Path(runs_dir) / name / "config.yaml"
        if run is None or not saved.is_file():
            continue
        old = yaml.safe_load(saved.read_text(encoding="utf-8")) or {}
        theirs = (old.get("preset"), (old.get("model") or {}).get("path"))
        ours = (run.get("preset"), config.get("model_dir"))
        if theirs != ours:
            out.append(f"{saved.parent}: a run of preset {theirs[0]} on {theirs[1]}, where test-paper "
                       f"trains preset {ours[0]} on {ours[1]}")
    return out


def snakemake_commands(configs: list[str], cores: int, targets: list[str]) -> list[list[str]]:
    """The harness's Snakemake calls: the downloads first (the mirror's tiny files, seconds),
    then `targets`. The preflight's disk estimate measures what is on disk and guesses the
    paper's sizes (a 20 GB model, ~80,000 prompts to embed: ~150 GB) for what is not yet; with
    the replicas downloaded it measures them instead of refusing a disk that the paper would fill."""
    merged = merged_config(configs)
    downloads = [merged["model_dir"], merged["reward_ckpt_dir"], merged["raw_dir"]]
    base = ["snakemake", "--configfile", *configs, f"-c{cores}"]
    return [base + downloads, base + targets]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m beds.paper_mini", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mirror", default="data/mirror")
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--log", default="logs/paper-mini.log")
    p.add_argument("--also", action="append", default=[], metavar="CONFIG",
                   help="one more --configfile after the two (e.g. to drop a reward this install lacks)")
    p.add_argument("targets", nargs="*", default=["all"])
    args = p.parse_args(argv)
    start, started = time.monotonic(), time.time()
    foreign = foreign_runs(merged_config([*CONFIGS, *args.also]))
    for problem in foreign:
        print(f"test-paper: {problem}", file=sys.stderr)
    if foreign:
        print("test-paper: it writes results/ of this checkout; run it in a fresh clone, or move "
              "results/ aside first (mv results results.before-test-paper)", file=sys.stderr)
        return 2
    mirror = Path(args.mirror)
    if not is_current(mirror):
        build_mirror(mirror, seed=0)
    options = mirror / "reward_options.yaml"
    options.write_text(yaml.safe_dump(replica_reward_options(mirror), sort_keys=True))
    env = dict(os.environ, MARBLE_MANIFEST=str(mirror / "manifest.yaml"), HF_HUB_DISABLE_TELEMETRY="1",
               MARBLE_REWARD_OPTIONS=str(options.resolve()))
    # Jobs run here (-c2): a SLURM daemon left by other tests must not judge GPU job shapes.
    env["MARBLE_LOCAL_JOBS"] = "1"
    env.setdefault("HF_TOKEN", "hf_mirror")  # the mirror's gated repo wants a bearer token, any
    # The fake UnifiedReward judge is started by the workflow itself beside each evaluation
    # that needs it (eval.unifiedreward in .test/paper-mini.yaml), not here.
    env.pop("MARBLE_UNIFIEDREWARD_URL", None)
    with MirrorServer(mirror, idle_s=1800) as server:
        env.update(HF_ENDPOINT=server.url, MARBLE_MIRROR=server.url)
        Path(args.log).parent.mkdir(parents=True, exist_ok=True)
        with open(args.log, "w") as log:
            for cmd in snakemake_commands([*CONFIGS, *args.also], args.cores, args.targets):
                print(" ".join(cmd), f"(mirror {server.url})", flush=True)
                log.flush()
                proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
                if proc.returncode != 0:
                    break
    wall = time.monotonic() - start
    for stage, seconds in stage_times():
        print(f"  {seconds:7.1f} s  {stage}")
    ranks = yaml.safe_load(Path(CONFIGS[1]).read_text())["eval"]["processes"]
    sizes = eval_world_sizes(since=started) if proc.returncode == 0 else {}
    problems = rank_problems(sizes, ranks)
    for problem in problems:
        print(f"test-paper: {problem}", file=sys.stderr)
    if proc.returncode == 0 and not problems:
        print(f"test-paper: passed in {wall / 60:.1f} min (snakemake log {args.log}; "
              f"{len(sizes)} evaluations, {ranks} ranks each)")
        return 0
    if problems:
        return 1
    stages = failed_stages(Path(args.log).read_text(errors="replace"))
    print(f"test-paper: FAILED after {wall / 60:.1f} min (snakemake log {args.log})", file=sys.stderr)
    for rule, log in stages or [("snakemake", args.log)]:
        print(f"\n--- stage {rule} failed; log {log}\n{tail(log or args.log)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
