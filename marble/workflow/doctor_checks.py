"""What `marble doctor` checks, as small functions: the rewards a workflow config uses,
the modules each needs, manifest verification, the disk estimate, command probes."""

from __future__ import annotations

import re
import shlex
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path


from marble.config_parse import load_yaml
from marble.assets.download import load_manifest
from marble.assets.hub_ref import COMMIT, is_hub_ref, parse_hub_ref
from marble.config import load_config
from marble.evaluation.datasets import DEFAULT_REWARDS
from marble.rewards import REGISTRY as REWARDS
from marble.runtime.io import sha256_file
from marble.workflow.cost import checkpoint_gb
from marble.workflow.evaluation import HUB_MODEL_DIR, JUDGE, hub_models
from marble.workflow.flops import load_table
from marble.workflow.runs import configured

# A row of the doctor's table and its statuses (marble.doctor and marble.doctor_slurm build them).
OK, FAIL, WARN, SKIP = "ok", "FAIL", "warn", "skip"


@dataclass
class Check:
    """One row of the table."""

    name: str
    status: str
    detail: str
    fix: str = ""


# Disk estimates (GB) for what the paper pipeline downloads: the SD3.5 Medium snapshot of
# the manifest (transformer, three text encoders, VAE) and the reward checkpoints group.
MODEL_GB = {"paper": 20.0}
REWARD_CKPTS_GB = 11.0
# The embedding cache stores per prompt [77 CLIP + max_sequence_length T5 tokens, 4096]
# plus the pooled [2048], in embed_dtype (fp16: 2 bytes).
EMBED_WIDTH, CLIP_TOKENS, POOLED = 4096, 77, 2048
PAPER_PROMPTS_GUESS = 80_000  # train + test prompts when the files are not downloaded yet


def merge(dst: dict, src: dict) -> dict:
    """Snakemake's --configfile merge: nested mappings merged, other values replaced."""
    for key, value in src.items():
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            merge(dst[key], value)
        else:
            dst[key] = value
    return dst


def required_modules(name: str, options: dict) -> tuple[str, ...]:
    """The import names a configured scorer needs beyond torch (its descriptor's `modules`; none
    under one of its `light_options`, e.g. GenEval's stand-in detector `detector: stub` of the CPU
    harnesses); an unregistered name needs none here (its row fails on the registry)."""
    spec = REWARDS.get(name)
    if spec is None or any(options.get(key) == value for key, value in spec.light_options):
        return ()
    return spec.modules


def reward_extra(name: str) -> str:
    """The environment (docs/cluster.md, workflow/envs/) that provides the reward's modules."""
    return REWARDS[name].extra if name in REWARDS else ""


def doctor_rows(name: str) -> tuple[str, ...]:
    """The extra checks the doctor runs for a configured reward (its descriptor's `doctor_rows`)."""
    return REWARDS[name].doctor_rows if name in REWARDS else ()


def managed_judge(config: dict) -> str | None:
    """The command the workflow starts the UnifiedReward judge with (eval.unifiedreward.server),
    or None when the client must find a running server itself."""
    return ((config.get("eval") or {}).get(JUDGE) or {}).get("server")


def configured_rewards(config: dict) -> dict[str, dict]:
    """{reward: options} over every run's preset and every evaluated dataset."""
    out: dict[str, dict] = {}
    for spec in configured(config.get("runs")).values():
        cfg = load_config(spec["preset"], [], list(spec.get("set") or []))
        for reward in cfg.rewards:
            out.setdefault(reward.name, dict(reward.options))
    evaluation = config.get("eval") or {}
    chosen = evaluation.get("rewards") or {}
    for dataset in evaluation.get("datasets") or []:
        for name in chosen.get(dataset) or DEFAULT_REWARDS[dataset]:
            out.setdefault(name, dict((evaluation.get("reward_options") or {}).get(name, {})))
    return out


def kept_checkpoints_gb(config: dict) -> float:
    """GB the configured runs' kept checkpoints take: each run's checkpoint size (the plan's
    model, marble.workflow.cost.checkpoint_gb) x its own `train.keep_checkpoints`."""
    table, total = load_table(), 0.0
    for spec in configured(config.get("runs")).values():
        cfg = load_config(spec["preset"], [], list(spec.get("set") or []))
        total += checkpoint_gb(cfg, table) * cfg.train.keep_checkpoints
    return total


def needs_torchvision(config: dict) -> bool:
    return any("torchvision" in required_modules(name, {}) for name in configured_rewards(config))


def needs_mmcv(config: dict) -> bool:
    """Whether a configured reward's doctor checks include mmcv's CUDA kernels (GenEval's detector)."""
    return any("mmcv" in doctor_rows(name) for name in configured_rewards(config))


def wants_gpu(config: dict) -> bool:
    train = config.get("train") or {}
    resources = (config.get("eval") or {}).get("resources") or {}
    return bool(train.get("gpus_per_node") or resources.get("gpus"))


def verify_group(group: str, folder: Path) -> tuple[list[str], int]:
    """(files missing or not matching the manifest, files without a pinned sha256)."""
    bad, unpinned = [], 0
    for entry in (e for e in load_manifest() if e.group == group):
        path = folder / entry.path
        if not path.is_file():
            bad.append(f"{entry.path} (missing)")
        elif entry.size is not None and path.stat().st_size != entry.size:
            bad.append(f"{entry.path} (size {path.stat().st_size}, manifest {entry.size})")
        elif entry.sha256 is None:
            unpinned += 1
        elif sha256_file(path) != entry.sha256:
            bad.append(f"{entry.path} (sha256 differs from the manifest)")
    return bad, unpinned


def _prompt_count(raw_dir: Path) -> int | None:
    files = [p for p in raw_dir.rglob("*") if p.suffix in (".txt", ".jsonl")
             and "object_names" not in p.name] if raw_dir.is_dir() else []
    if not files:
        return None
    return sum(sum(1 for _ in p.open(encoding="utf-8", errors="replace")) for p in files)


# Sizes of what evaluation fetches and writes, in GB. Assumed from the repositories' file lists
# (the pipeline components in the precision the protocol loads), not measured here.
HUB_MODEL_GB = {"stable-diffusion-3.5-large": 27.0, "FLUX.1-dev": 34.0,
                "stable-diffusion-xl-base-1.0": 7.0, "UnifiedReward-7b-v1.5": 16.0}
HUB_MODEL_GB_DEFAULT = 20.0  # a hub model not in the table
LORA_GB = 0.1  # a public LoRA of SD3.5-M (rank 32 or less)
EVAL_GB = 1.0  # one evaluation (row x dataset): ~1000 PNGs and their scores, assumed
GUESSED = "(guessed)"  # marks the parts of an estimate that are not counted from files


def disk_estimate(config: dict, root: Path, via_dvc: bool = False) -> tuple[float, str]:
    """(GB still to be written, what it is made of). A download counts as present only when
    it verifies (manifest sizes and hashes), not because its folder exists. `via_dvc`: the
    run goes through `dvc repro` / `dvc exp run`, which write every output twice in a DVC
    repository (the cache: most cluster filesystems have no reflinks); Snakemake alone
    (`snakemake --profile slurm all`) never writes DVC's cache."""
    if config.get("mode") != "paper":
        return 0.5, "tiny model, tables, runs, evaluations"
    parts: dict[str, float] = {}
    for group, folder, label in (("model", config["model_dir"], "model"),
                                 ("rewards", config["reward_ckpt_dir"], "reward checkpoints")):
        if verify_group(group, root / folder)[0]:
            parts[label] = manifest_gb(group) or {"model": MODEL_GB["paper"]}.get(group, REWARD_CKPTS_GB)
    dataset = config.get("dataset") or {}
    if dataset.get("embed"):
        count = _prompt_count(root / config["raw_dir"])
        tokens = CLIP_TOKENS + 128  # marble.config: model.max_sequence_length default
        row = (tokens * EMBED_WIDTH + POOLED) * 2
        parts["embedding cache" + ("" if count else f" {GUESSED}")] = \
            (count or PAPER_PROMPTS_GUESS) * row / 2**30
    parts["checkpoints"] = kept_checkpoints_gb(config)
    parts.update(_evaluation_parts(config, root))
    if via_dvc and (root / ".dvc").is_dir():  # DVC copies every output into its cache
        guessed = sum(v for k, v in parts.items() if GUESSED in k)
        parts["DVC cache copies"] = sum(parts.values()) - guessed
        if guessed:
            parts[f"DVC cache copies {GUESSED}"] = guessed
    total = sum(parts.values())
    return total, ", ".join(f"{k} {v:.1f}" for k, v in parts.items())


def _evaluation_parts(config: dict, root: Path) -> dict[str, float]:
    """Hub base models and the judge still to fetch, public LoRAs, evaluation outputs."""
    ev = config.get("eval") or {}
    hub = root / HUB_MODEL_DIR
    missing = [folder for folder in hub_models(ev) if not any((hub / folder).glob("*"))]
    gb = sum(next((size for name, size in HUB_MODEL_GB.items() if name in folder),
                  HUB_MODEL_GB_DEFAULT) for folder in missing)
    loras = [row for row, src in configured(ev.get("checkpoints")).items() if is_hub_ref(str(src))]
    rows = len(configured(ev.get("checkpoints"))) + len(configured(config.get("runs")))
    out = {f"hub models {GUESSED}": gb} if gb else {}
    if loras:
        out["LoRAs"] = LORA_GB * len(loras)
    out[f"evaluations {GUESSED}"] = EVAL_GB * rows * len(ev.get("datasets") or [])
    return out


def manifest_gb(group: str) -> float | None:
    """A download group's size from the manifest (every entry sized), else None."""
    sizes = [e.size for e in load_manifest() if e.group == group]
    return sum(sizes) / 2**30 if sizes and None not in sizes else None


def guessed_gb(parts: str) -> float:
    """The share of a disk estimate's parts (its text) that is a guess, not a count."""
    return sum(float(part.rsplit(" ", 1)[1]) for part in parts.split(", ") if GUESSED in part)


def http_get(url: str, timeout: float = 3.0) -> str | None:
    """None when `url` answers 2xx, else why not (one line)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # the configured server URL
            return None if resp.status < 300 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return f"unreachable ({getattr(exc, 'reason', exc)})"


def run_out(cmd: list[str]) -> str:
    """A probe's stdout ('' when the command is missing or fails)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""


def run_probe(cmd: list[str]) -> subprocess.CompletedProcess | None:
    """A command's result with its exit status and stderr (None when missing or hung)."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def mmcv_cuda_kernel() -> str | None:
    """Run one mmcv CUDA op; the error of a build for another arch, else None."""
    try:
        import torch
        from mmcv.ops import nms

        boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0]], device="cuda")
        nms(boxes, torch.tensor([1.0], device="cuda"), 0.5)
    except Exception as exc:  # "no kernel image is available", undefined symbols, ...
        return f"{type(exc).__name__}: {exc}"
    return None


def hub_references(config: dict) -> dict[str, str]:
    """{config key: `hf:` reference} of everything evaluation fetches from the hub: the
    eval.checkpoints LoRAs (null rows skipped), each row's base model, the judge's weights."""
    ev = config.get("eval") or {}
    refs = {f"eval.checkpoints.{row}": str(src) for row, src in configured(ev.get("checkpoints")).items()}
    refs.update({f"eval.protocols.{row}.model": str((spec or {}).get("model"))
                 for row, spec in (ev.get("protocols") or {}).items()})
    refs[f"eval.{JUDGE}.model"] = str((ev.get(JUDGE) or {}).get("model"))
    return {key: ref for key, ref in refs.items() if is_hub_ref(ref)}


def unpinned_hub_references(config: dict) -> dict[str, str]:
    """The hub references among them without a 40-hex commit (the fetch refuses those, so a
    run would stop at its first download): {config key: reference}."""
    return {key: ref for key, ref in hub_references(config).items()
            if not COMMIT.match(parse_hub_ref(ref)[1] or "")}


def without_it(key: str) -> str:
    """How to run without the hub reference at `key` (an overlay cannot delete a key: it nulls)."""
    if key == f"eval.{JUDGE}.model":
        return f"point {key} at a local folder of the judge's weights"
    row = key.split(".")[2]
    return f"drop the row in your own --configfile (eval.checkpoints.{row}: null)"


def judge_probe(server: str) -> list[str] | None:
    """The command that proves the judge's environment exists and imports sglang, from the
    server command the workflow starts (eval.unifiedreward.server): `conda run -n NAME ...`
    -> `conda run -n NAME python -c "import sglang"`; `/path/python -m sglang...` -> that
    python. None for any other launcher (a wrapper script: its own business)."""
    words = shlex.split(server)
    if words[:2] == ["conda", "run"] and "-n" in words:
        name = words[words.index("-n") + 1]
        return ["conda", "run", "-n", name, "python", "-c", "import sglang"]
    if words and Path(words[0]).name.startswith("python") and "sglang.launch_server" in words:
        return [words[0], "-c", "import sglang"]
    return None


_INSTANCE = re.compile(r"On instance((?:\[[^\]]+\])*):")
_UNEXPECTED = re.compile(r"\('([^']+)' was unexpected\)")


def schema_error(text: str) -> tuple[list[str], str]:
    """(key path, message) of a Snakemake schema ValidationError's text: the instance path
    (`On instance['train']['nodes']:`) plus, for an unknown key, that key's name."""
    lines = [line.strip() for line in text.splitlines()]
    message = next((line.split(":", 1)[1].strip() for line in lines
                    if line.startswith("ValidationError:")), lines[0] if lines else text)
    match = _INSTANCE.search(text)
    path = re.findall(r"\['([^']*)'\]", match.group(1)) if match else []
    unexpected = _UNEXPECTED.search(message)
    return (path + [unexpected.group(1)] if unexpected else path), message


def key_owner(layers: list[dict], path: list[str]) -> int | None:
    """Index of the last config layer (merge order) that sets `path`, or the longest prefix of
    it; None when no layer names even its first key (a schema default)."""
    best, best_depth = None, 0
    for index, layer in enumerate(layers):
        node, depth = layer, 0
        for key in path:
            if not isinstance(node, dict) or key not in node:
                break
            node, depth = node[key], depth + 1
        if depth and depth >= best_depth:
            best, best_depth = index, depth
    return best


def schema_error_line(text: str, files: list, layers: list[dict] | None = None) -> str:
    """`FILE: key.path: message` for a schema error of the config merged from `files` (in
    order): the file is the last one that sets the key (else the schema's default)."""
    if layers is None:
        layers = [load_yaml(Path(f).read_text(encoding="utf-8")) or {} for f in files]
    key, message = schema_error(text)
    owner = key_owner(layers, key)
    where = files[owner] if owner is not None else "workflow/schemas/config.schema.yaml (a default)"
    return f"{where}: {'.'.join(key) or 'config'}: {message}"
