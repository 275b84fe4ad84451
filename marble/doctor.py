"""`marble doctor`: will this workflow config run here? One table, a fix per failure.

    marble doctor                                  # config.yaml (the tiny default)
    marble doctor --configfile config/paper.yaml site.yaml

Run it on the login node before queueing anything (the `preflight` rule of `all` does).
For the given workflow config it checks: every configured reward (training presets and
evaluation) imports and, for the cheap ones, builds; the files its checkpoints come from
are present and match the manifest (size, and sha256 where pinned); the OCR engine the
preset names; the UnifiedReward server answers; torch / torchvision / mmcv import as a
pair and, with a GPU visible, run a kernel on it (the CUDA arch they were built for);
HF_TOKEN when a gated model still has to be downloaded; free disk for the model,
checkpoints and the embedding cache (estimate printed); the SLURM partition, GPU type and
account of `cluster:` (sinfo / sacctmgr, when present) and whether each job shape fits
(`sbatch --test-only` with the job's own options); every hub reference evaluation
fetches names a commit. Exit 1 on any FAIL; WARN rows
(e.g. no GPU on a login node) do not fail.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
from pathlib import Path

from marble import rewards
from marble.workflow import configs
from marble.workflow import doctor_checks as checks
from marble.workflow import evaluation as wf_eval
from marble.workflow import hub_lock
from marble.workflow import slurm_capacity as capacity
from marble.workflow.doctor_checks import FAIL, OK, SKIP, WARN, Check
from marble.doctor_slurm import LOCAL_JOBS_ENV, local_rows, slurm_rows
from marble.runtime import install
from marble.workflow.preflight import read_snapshot, snapshot_targets

__all__ = ["Check", "OK", "FAIL", "WARN", "SKIP", "main", "run_checks", "render"]

def load_workflow_config(files: list[str], root: Path) -> dict:
    """Like the Snakefile: config.yaml unless --configfile files are given (merged in
    order, later keys win), then the schema's defaults."""
    paths = [root / f for f in files] if files else [root / "config.yaml"]
    try:  # the workflow's own reading, merge and `overlay_on:` composition (one line on bad input)
        layers = [configs.read_yaml(path) for path in paths]
        base = next((layer[configs.OVERLAY_KEY] for layer in reversed(layers) if layer.get(configs.OVERLAY_KEY)), None)
        if base:  # the lowest layer, for a schema error's file name
            paths, layers = [root / base, *paths], [configs.read_yaml(root / base), *layers]
        config = configs.load(files or ["config.yaml"], root)
    except SystemExit as exc:
        raise SystemExit(f"marble doctor: {exc}") from None
    schema = root / "workflow/schemas/config.schema.yaml"
    try:
        from snakemake.utils import validate
    except ImportError:  # no workflow extra: raw values (the doctor says so below)
        return config
    try:
        validate(config, str(schema))
    except Exception as exc:  # snakemake's WorkflowError names the key
        # One line, blaming the file that sets the key (not merely the last one given).
        line = checks.schema_error_line(str(exc), paths, layers)
        raise SystemExit(f"marble doctor: error: {line}") from None
    return config


# ------------------------------------------------------------------ rewards


def reward_rows(config: dict) -> list[Check]:
    rows = []
    for name, options in checks.configured_rewards(config).items():
        rows.append(_reward_row(name, options))
        # The reward's own checks, named by its descriptor (marble.rewards.catalogue).
        extra = checks.doctor_rows(name)
        if "ocr_engine" in extra:
            rows.append(_ocr_engine_row(options))
        if "judge" in extra:
            rows.append(_unifiedreward_row(options, checks.managed_judge(config)))
        if "mmcv" in extra and checks.required_modules(name, options):
            rows.append(_mmcv_row())
    return rows


def _reward_row(name: str, options: dict) -> Check:
    missing = [m for m in checks.required_modules(name, options) if not importlib.util.find_spec(m)]
    extra = checks.reward_extra(name)
    if missing:  # a config's own reward (extra "") names its modules, not one of our environments
        fix = (f"install the {extra!r} environment (docs/cluster.md, workflow/envs/)" if extra
               else f"install {', '.join(missing)} where the jobs run, under the site's torch "
                    f"constraint ({install.SITE_TORCH}: the config's `rewards:` entry names them)")
        return Check(f"reward {name}", FAIL, f"missing module(s) {', '.join(missing)}", fix)
    try:
        cls = rewards.reward_class(name)
        cheap = "build" in checks.doctor_rows(name)
        if cheap:
            rewards.build(name, **options)  # cheap: proves the whole build path
    except Exception as exc:  # any import or build error is this row's failure
        return Check(f"reward {name}", FAIL, f"{type(exc).__name__}: {exc}"[:200],
                     f"install the {extra!r} environment (docs/cluster.md)" if extra
                     else f"fix the `rewards:` entry of {name} (its target, its modules)")
    built = "built" if cheap else "imports"
    return Check(f"reward {name}", OK, f"{cls.__module__}.{cls.__name__} {built}")


def _ocr_engine_row(options: dict) -> Check:
    from marble.rewards.ocr import resolve_backend

    try:
        backend = resolve_backend(options.get("backend", "auto"))
    except (ImportError, ValueError) as exc:
        return Check("ocr engine", FAIL, str(exc), "install the OCR environment (docs/cluster.md)")
    module = {"paddle": "paddleocr"}.get(backend, backend)
    if not importlib.util.find_spec(module):
        fix = (f"on a GPU: {install.paddle_gpu()}; on a CPU: {install.extra('paddle')}"
               if module == "paddleocr" else install.extra("ocr"))
        return Check("ocr engine", FAIL, f"backend {backend!r}: {module} not installed", fix)
    detail = f"backend {backend}"
    if backend == "paddle" and options.get("use_gpu"):
        import paddle

        if not paddle.device.is_compiled_with_cuda():
            return Check("ocr engine", FAIL, "use_gpu but paddlepaddle is the CPU build",
                         f"install paddlepaddle-gpu: {install.paddle_gpu()}")
        detail += ", paddle GPU build"
    return Check("ocr engine", OK, detail)


def _unifiedreward_row(options: dict, managed: str | None = None) -> Check:
    from marble.rewards.unifiedreward import BASE_URL_ENV, DEFAULT_BASE_URL

    if managed:  # marble.rewards.service starts it beside each evaluation that scores it
        return _judge_env_row(managed)
    base = options.get("base_url") or os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL
    answer = checks.http_get(base.rstrip("/") + "/models")
    if answer is None:
        return Check("unifiedreward server", OK, f"{base} answers")
    return Check("unifiedreward server", FAIL, f"{base}: {answer}",
                 f"start the sglang server (workflow/envs/sglang.txt, docs/rewards.md) or set "
                 f"{BASE_URL_ENV} to where it runs")


def _judge_env_row(server: str) -> Check:
    """The judge's environment exists and imports sglang (each judged evaluation would else
    wait in the queue for a GPU, then die starting it)."""
    probe = checks.judge_probe(server)
    if probe is None:
        return Check("unifiedreward server", OK, f"started by the workflow per job: {server}"[:200])
    proc = checks.run_probe(probe)
    if proc is not None and proc.returncode == 0:
        return Check("unifiedreward server", OK, f"environment starts ({' '.join(probe[:4])}): "
                     "sglang imports; started by the workflow per job")
    if proc is None and shutil.which(probe[0]) is None:
        # Name the missing program itself (conda, or the venv's python), not "not found".
        return Check("unifiedreward server", FAIL, f"`{probe[0]}` is not installed here (not on PATH): the judge's "
                     f"server command cannot start: {server}"[:200],
                     "install conda (e.g. Miniforge) and create the judge's environment: conda env create -n "
                     "marble-sglang -f workflow/envs/sglang.yaml; or, without conda, build the venv of "
                     "workflow/envs/sglang.txt and point eval.unifiedreward.server at its python (docs/cluster.md)")
    why = "not found" if proc is None else (proc.stderr.strip().splitlines() or ["failed"])[-1]
    return Check("unifiedreward server", FAIL, f"{' '.join(probe)}: {why}"[:200],
                 "create the judge's environment: conda env create -n marble-sglang -f "
                 "workflow/envs/sglang.yaml (docs/cluster.md; or point eval.unifiedreward.server "
                 "at a venv's python, workflow/envs/sglang.txt)")


# mmcv-full 1.7.2 has no wheel for current torch and PyPI's source build fails under build
# isolation (`No module named 'pkg_resources'` with setuptools >= 81): the steps that work.
MMCV_FIX = ("build mmcv-full 1.7.2 against this torch as workflow/envs/geneval.txt says: "
            "pip install -c site-torch.txt \"setuptools<81\" wheel ninja, then TORCH_CUDA_ARCH_LIST=<your GPUs> "
            "MMCV_WITH_OPS=1 FORCE_CUDA=1 pip install -c site-torch.txt --no-build-isolation --no-cache-dir "
            "mmcv-full==1.7.2 (torch >= 2.14: the C++20 patch of `make test-geneval-mmdet` first)")


def _mmcv_row() -> Check:
    try:
        import mmcv
        from mmcv import ops  # noqa: F401  (the compiled extension)
    except Exception as exc:  # ImportError, or the ops' undefined-symbol OSError
        return Check("mmcv-full", FAIL, f"{type(exc).__name__}: {exc}"[:200], MMCV_FIX)
    if not mmcv.__version__.startswith("1.7"):
        return Check("mmcv-full", FAIL, f"mmcv {mmcv.__version__}; GenEval's mmdet 2.x needs 1.7.x", MMCV_FIX)
    return Check("mmcv-full", OK, f"mmcv {mmcv.__version__}, ops load")


# ------------------------------------------------------------------ torch, GPU


def torch_rows(config: dict) -> list[Check]:
    import torch

    rows = [Check("torch", OK, f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'})")]
    if checks.needs_torchvision(config):
        rows.append(_torchvision_row())
    rows.append(_gpu_row(config, torch))
    return rows


def _torchvision_row() -> Check:
    try:
        import torch
        import torchvision

        boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0]])
        torchvision.ops.nms(boxes, torch.tensor([1.0]), 0.5)  # fails on a mismatched pair
    except Exception as exc:
        return Check("torchvision", FAIL, f"{type(exc).__name__}: {exc}"[:200],
                     f"install the torchvision built for this torch: {install.torchvision(torch.__version__)}")
    return Check("torchvision", OK, f"torchvision {torchvision.__version__} pairs with torch")


def _gpu_row(config: dict, torch) -> Check:
    wants_gpu = checks.wants_gpu(config)
    if not torch.cuda.is_available():
        status = WARN if wants_gpu else SKIP
        return Check("gpu", status, "no GPU visible here: CUDA arch not checked",
                     "run `marble doctor` once inside a GPU job (srun --gres=gpu:1 ...)" if wants_gpu else "")
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    if arch not in torch.cuda.get_arch_list() and f"compute_{major}{minor}" not in torch.cuda.get_arch_list():
        return Check("gpu", FAIL, f"{torch.cuda.get_device_name()} is {arch}; torch built for "
                     f"{torch.cuda.get_arch_list()}", "install the site's CUDA build of torch")
    detail = f"{torch.cuda.get_device_name()} ({arch})"
    if checks.needs_mmcv(config):
        err = checks.mmcv_cuda_kernel()
        if err:
            return Check("gpu", FAIL, f"{detail}; mmcv CUDA op: {err}"[:200],
                         f"rebuild mmcv-full with TORCH_CUDA_ARCH_LIST={major}.{minor} (workflow/envs/geneval.txt)")
        detail += ", mmcv CUDA ops run"
    return Check("gpu", OK, detail)


# ------------------------------------------------------------------ assets, disk


def asset_rows(config: dict, root: Path, downloads_pending: bool = False,
               configfiles: tuple[str, ...] = ()) -> list[Check]:
    """Model and reward files against the manifest. downloads_pending (the preflight rule,
    which runs before the workflow's own downloads): a missing file is a warning, unless
    the config is `offline`; HF_TOKEN for the gated model stays a failure."""
    pending = downloads_pending and not config.get("offline")
    if config.get("mode") != "paper":
        return [Check("model", OK if (root / config["model_dir"]).is_dir() else SKIP,
                      f"tiny: {config['model_dir']} is built by the workflow")]
    rows = []
    for group, folder in (("model", config["model_dir"]), ("rewards", config["reward_ckpt_dir"])):
        bad, unpinned = checks.verify_group(group, root / folder)
        if bad:
            gated = group == "model" and not os.environ.get("HF_TOKEN")
            # the command as the user runs it: the profile and the same config files
            files = f" --configfile {' '.join(configfiles)}" if configfiles else ""
            fix = f"snakemake --profile slurm prepare{files} (downloads {group} into {folder})"
            rows.append(Check(f"{group} files", WARN if pending else FAIL,
                              f"{len(bad)} missing or wrong in {folder}: "
                              f"{', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}", fix))
            if gated:
                rows.append(Check("HF_TOKEN", FAIL, "SD3.5 Medium is gated and must be downloaded",
                                  "accept the licence on its model page, then export HF_TOKEN=hf_..."))
        else:
            rows.append(Check(f"{group} files", OK, f"{folder} complete"
                              f"{f' ({unpinned} without a pinned sha256: size only)' if unpinned else ''}"))
    return rows


def hub_rows(config: dict) -> list[Check]:
    """Every hub reference evaluation fetches names a commit (else its fetch fails the run)."""
    refs = checks.hub_references(config)
    unpinned = checks.unpinned_hub_references(config)
    # `marble hub lock` pins every placeholder at once (the config's lock file); a hand-picked
    # commit and dropping the row stay the alternatives.
    rows = [Check(f"hub pin {key}", FAIL, f"{ref}: not a 40-hex commit, the fetch refuses it",
                  f"`marble hub lock --configfile <your config files>` writes today's commit of every "
                  f"{hub_lock.PLACEHOLDER} to the lock file; or put the repo's commit after @ (`git ls-remote "
                  f"https://huggingface.co/{checks.parse_hub_ref(ref)[0]} HEAD`), or {checks.without_it(key)}")
            for key, ref in unpinned.items()]
    if refs and not unpinned:
        rows.append(Check("hub pins", OK, f"{len(refs)} hub references, each at a commit"))
    # A commit from `marble hub lock` is main on the day it ran: for repos known to have moved
    # since the paper, say so (a WARN: the run can go, the comparison may not be like for like).
    rows += [Check(f"hub revision {repo}", WARN, note, "pin the paper's commit if its authors name one")
             for repo, note in hub_lock.postdate_notes(config).items()]
    return rows


def gated_rows(config: dict, root: Path) -> list[Check]:
    """HF_TOKEN for every gated base model evaluation still has to fetch (SD3.5-L, FLUX.1-Dev)."""
    models = wf_eval.hub_models(config.get("eval") or {})
    hub_dir = root / wf_eval.HUB_MODEL_DIR
    present = {p.name for p in hub_dir.iterdir() if p.is_dir()} if hub_dir.is_dir() else set()
    gated = capacity.gated_to_fetch(models, present)
    if not gated or os.environ.get("HF_TOKEN"):
        return []
    names = ", ".join(capacity.GATED_REPOS[r] for r in gated)
    return [Check("HF_TOKEN (hub models)", FAIL, f"{names} gated and still to be fetched",
                  "accept each licence on its model page, then export HF_TOKEN=hf_... "
                  f"({', '.join(gated)})")]


def disk_row(config: dict, root: Path, downloads_pending: bool = False, via_dvc: bool | None = None) -> Check:
    """`via_dvc` (default: whether this runs inside a DVC stage, which sets DVC_STAGE): the
    path the target takes; only `dvc repro` / `dvc exp run` add DVC's cache copies."""
    if via_dvc is None:
        via_dvc = bool(os.environ.get("DVC_STAGE"))
    need_gb, parts = checks.disk_estimate(config, root, via_dvc)
    target = root / "data"
    probe = target if target.exists() else root
    free_gb = shutil.disk_usage(probe).free / 2**30
    detail = f"{free_gb:.0f} GB free at {probe}; needs ~{need_gb:.1f} GB ({parts})"
    if not via_dvc and (root / ".dvc").is_dir():
        # Said, not counted: Snakemake alone never writes DVC's cache.
        extra = checks.disk_estimate(config, root, via_dvc=True)[0] - need_gb
        if extra > 0:
            detail += f"; through `dvc repro` / `dvc exp run` ~{extra:.1f} GB more (DVC's cache copies)"
    fix = "free space, or put data/ and results/ on a larger filesystem"
    if free_gb < need_gb - checks.guessed_gb(parts):
        return Check("disk", FAIL, detail, fix)
    if free_gb < need_gb:
        # Short only by the guessed parts: before the downloads (the preflight) a warning; the
        # doctor run after `prepare` counts them from the files.
        return Check("disk", WARN if downloads_pending else FAIL, detail, fix)
    return Check("disk", OK, detail)


# ------------------------------------------------------------------ the table


def run_checks(config: dict, root: Path, downloads_pending: bool = False,
               configfiles: tuple[str, ...] = (), local_jobs: bool = False, targets=()) -> list[Check]:
    """`local_jobs`: the workflow runs its jobs on this machine (Snakemake's local executor), so
    nothing is submitted and SLURM's partitions and capacity are not its concern. `targets`:
    the Snakemake targets whose SLURM jobs are checked (none: every job)."""
    rows: list[Check] = []
    for group in (lambda: torch_rows(config), lambda: reward_rows(config),
                  lambda: asset_rows(config, root, downloads_pending, configfiles), lambda: hub_rows(config),
                  lambda: gated_rows(config, root),
                  lambda: [disk_row(config, root, downloads_pending)],
                  lambda: local_rows() if local_jobs else slurm_rows(config, root, targets)):
        rows.extend(group())
    return rows


def render(rows: list[Check]) -> str:
    width = max(len(r.name) for r in rows)
    lines = [f"{'check':<{width}}  status  detail", f"{'-' * width}  ------  ------"]
    for r in rows:
        lines.append(f"{r.name:<{width}}  {r.status:<6}  {r.detail}")
        if r.fix and r.status in (FAIL, WARN):
            lines.append(f"{'':<{width}}          fix: {r.fix}")
    failed = [r.name for r in rows if r.status == FAIL]
    lines.append(f"\n{len(failed)} failure(s){': ' + ', '.join(failed) if failed else ''}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="marble doctor", description=__doc__.split("\n\n")[0])
    p.add_argument("--configfile", nargs="+", default=[], metavar="FILE",
                   help="workflow config file(s), merged in order (default: config.yaml)")
    p.add_argument("--snapshot", type=Path, default=None, metavar="FILE",
                   help="the workflow's resolved config and --configfile list (the preflight rule's "
                        "results/preflight.config.json), instead of reading --configfile")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="the workflow folder")
    p.add_argument("--downloads-pending", action="store_true",
                   help="missing model/reward files are still to be downloaded (a warning)")
    p.add_argument("--local-jobs", action="store_true",
                   help="the workflow runs its jobs here (no SLURM submission): SLURM is not checked; "
                        f"also {LOCAL_JOBS_ENV}=1 (the preflight rule's doctor reads it)")
    p.add_argument("--target", nargs="+", default=None, metavar="TARGET",
                   help="the Snakemake target(s) to run (all, eval_only, train, ...): only the SLURM jobs "
                        "they submit are checked (default: those the snapshot names, else every job)")
    args = p.parse_args(argv)
    if args.snapshot is not None:  # what Snakemake resolved and validated, --config included
        if args.target is None:
            args.target = snapshot_targets(args.snapshot)
        try:
            config, args.configfile = read_snapshot(args.snapshot)
        except ValueError as exc:
            raise SystemExit(f"marble doctor: error: {exc}") from None
    else:
        config = load_workflow_config(args.configfile, args.root)
    try:  # the config's own rewards (`rewards:`, by import path) join the registry it checks
        rewards.register_config(config.get("rewards"), args.root)
    except ValueError as exc:
        raise SystemExit(f"marble doctor: error: {exc}") from None
    # The preflight rule cannot know the executor when its command is formed (a params function
    # would change between the dry run and the run and rerun it): a local-only harness says so.
    local_jobs = args.local_jobs or os.environ.get(LOCAL_JOBS_ENV) == "1"
    rows = run_checks(config, args.root, args.downloads_pending, tuple(args.configfile), local_jobs,
                      tuple(args.target or ()))
    print(render(rows))
    return 1 if any(r.status == FAIL for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
