"""A tiny local mirror of every paper asset: `python -m beds.mirror --out DIR --seed 0`.

For every entry of the manifest (and so every model a scorer loads) it writes a random-init
replica in the on-disk format the real loading code reads, under the same names:
- hub/<repo>/<path>: the SD3.5 pipeline folder (marble.models.tiny, re-laid-out as the real
  repo: CLIP tokenizers as vocab.json + merges.txt, T5 in two shards with an index, a
  sentencepiece spiece.model), CLIP folders (model + processor) for PickScore, the laion
  processor and OpenAI ViT-L/14, BERT's tokenizer files, the HPSv2.1 open_clip state dict,
  ImageReward's `ImageReward.pt` + `med_config.json`;
- urls/<host>/<path>: the aesthetic head, a detector checkpoint stand-in, GenEval's
  `object_names.txt` and the prompt files (marble.data.tiny_prompts);
- hub/<repo>/ of Table 1's public rows whose commit config/paper.yaml pins (not manifest
  entries: the workflow fetches them by `hf:repo@commit`): tiny SD-XL and FLUX.1 pipelines
  (replicas_t2i), an SD3 pipeline for SD3.5-L, a peft LoRA for the SD3 replica (FlowGRPO's);
- mirror.json (repo -> pinned revision, gated) for beds.mirror_server, and
  manifest.yaml: the packaged manifest with every size and sha256 replaced by the replica's,
  so `marble download --manifest DIR/manifest.yaml` verifies what the mirror serves.
Deterministic from the seed; a few seconds and ~10 MB.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import tempfile
from pathlib import Path

import yaml

from marble.assets.manifest import MANIFEST, load_manifest
from marble.rewards import descriptors
from marble.runtime.io import sha256_file
from beds import replicas, replicas_hps
from marble.workflow import configs

# open_clip architecture of the HPS replica (pass it as the hpsv2 reward's model_config/arch).
HPS_ARCH = "marble-tiny-hps"
# Bumped when a replica's format changes, so a harness rebuilds an older mirror folder.
REPLICA_VERSION = 5  # 3: PaddleOCR's model tars; 4: Table 1's public rows; 5: the DiffusionNFT LoRA
# The paper config whose pinned public rows (eval.checkpoints, eval.protocols.*.model) the
# mirror serves at their commits (the one place those commits are written).
PAPER_CONFIG = Path(__file__).resolve().parents[2] / "config" / "paper.yaml"


def is_current(out: str | Path) -> bool:
    """Whether `out` holds a mirror written by this version of the generator."""
    meta = Path(out) / "mirror.json"
    return meta.is_file() and json.loads(meta.read_text()).get("version") == REPLICA_VERSION


def replica_reward_options(out: str | Path) -> dict[str, dict]:
    """{reward: options} that point the real scorer classes at what the replicas cannot say by
    their files alone: HPS's tiny open_clip architecture, GenEval's stand-in detector (no mmdet);
    keyed by each reward's replica writer (its descriptor's `replica`)."""
    by_kind = {"open_clip": {"arch": HPS_ARCH, "model_config": str(Path(out).resolve() / f"{HPS_ARCH}.json")},
               "mask2former": {"detector": "stub"}}
    return {d.name: by_kind[d.replica] for d in descriptors() if d.replica in by_kind}


def _hub_builders(seed: int) -> dict:
    """repo id -> function(folder) writing that repo's replica files."""
    return {
        "stabilityai/stable-diffusion-3.5-medium": lambda d: replicas.sd3_repo(d, seed),
        "yuvalkirstain/PickScore_v1": lambda d: replicas.clip_repo(d, seed + 1),
        "laion/CLIP-ViT-H-14-laion2B-s32B-b79K": lambda d: replicas.clip_repo(d, seed + 2),
        "openai/clip-vit-large-patch14": lambda d: replicas.clip_repo(d, seed + 3),
        "google-bert/bert-base-uncased": lambda d: replicas.bert_repo(d),
        "xswu/HPSv2": lambda d: replicas_hps.hps_repo(d, seed + 4),
        "zai-org/ImageReward": lambda d: replicas.imagereward_repo(d, seed + 5),
    }


def _public_row_builders(seed: int) -> dict:
    """repo id -> (function(folder) writing its replica, gated) for Table 1's public rows."""
    from beds import replicas_t2i

    return {
        "stabilityai/stable-diffusion-xl-base-1.0": (lambda d: replicas_t2i.sdxl_repo(d, seed + 20), False),
        "black-forest-labs/FLUX.1-dev": (lambda d: replicas_t2i.flux_repo(d, seed + 21), True),
        # SD3.5-L is an SD3 pipeline (evaluated through the generic path, model_type generic).
        "stabilityai/stable-diffusion-3.5-large": (lambda d: replicas.sd3_repo(d, seed + 22), True),
        # A LoRA for the SD3.5-M replica, in the hub repo's peft format.
        "jieliu/SD3.5M-FlowGRPO-PickScore": (lambda d: replicas.sd3_peft_lora_repo(d, seed + 23), False),
        # The DiffusionNFT multi-reward LoRA (pinned since issue 29), in the same peft format.
        "worstcoder/SD3.5M-DiffusionNFT-MultiReward": (lambda d: replicas.sd3_peft_lora_repo(d, seed + 24), False),
    }


def pinned_public_rows(config: str | Path = PAPER_CONFIG) -> dict[str, str]:
    """{repo: commit} of every `hf:repo@<40-hex commit>` a Table 1 row of `config` names (a
    LoRA in eval.checkpoints, a base model in eval.protocols.*.model); rows still marked
    PIN-A-COMMIT are left out (the workflow's fetch refuses them too)."""
    from marble.assets.hub_ref import is_hub_ref, parse_hub_ref

    # config/paper.yaml is an overlay on config/eval.yaml (its base, beside it in config/).
    ev = configs.load([config], root=Path(config).resolve().parents[1]).get("eval") or {}
    refs = [*(ev.get("checkpoints") or {}).values(),
            *((spec or {}).get("model") for spec in (ev.get("protocols") or {}).values())]
    out = {}
    for ref in refs:
        if ref and is_hub_ref(str(ref)):
            repo, revision = parse_hub_ref(str(ref))
            if revision and re.fullmatch(r"[0-9a-f]{40}", revision):
                out[repo] = revision
    return out


def _url_builders(seed: int, tmp: Path) -> dict:
    """file name (the last part of a URL) -> function(path) writing that file."""
    raw = tmp / "raw"
    replicas.prompt_files(raw, seed)
    out = {
        "sac+logos+ava1-l14-linearMSE.pth": lambda p: replicas.aesthetic_head(p, seed + 6),
        "object_names.txt": replicas.object_names,
        "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco_20220504_001756-743b7d99.pth":
            lambda p: replicas.detector_ckpt(p, seed + 7),
    }
    from marble.rewards.paddle_models import MODELS as PADDLE_MODELS

    for i, name in enumerate(PADDLE_MODELS.values()):
        out[f"{name}.tar"] = lambda p, name=name, i=i: replicas.paddle_model_tar(p, name, seed + 8 + i)
    for f in raw.rglob("*"):
        if f.is_file():
            out[f.relative_to(raw).as_posix()] = lambda p, f=f: shutil.copyfile(f, p)
    return out


def _url_key(url: str, builders: dict) -> str:
    """The builder for a URL: its dataset-relative path (`pickscore/train.txt`) or its file name."""
    rest = url.split("://", 1)[-1]
    for key in sorted(builders, key=len, reverse=True):
        if rest.endswith("/" + key):
            return key
    raise KeyError(f"no replica for {url}: add a builder to beds.mirror")


def url_path(url: str) -> str:
    """`https://host/a/b` -> `host/a/b` (where the mirror serves it)."""
    return url.split("://", 1)[-1]


def _digest(path: Path) -> tuple[int, str]:
    return path.stat().st_size, sha256_file(path)


def _build_public_rows(out: Path, seed: int, paper_config: str | Path) -> dict[str, dict]:
    """Write the replica of every pinned public row; {repo: mirror.json entry} (its commit)."""
    builders, repos = _public_row_builders(seed), {}
    for repo, commit in pinned_public_rows(paper_config).items():
        if repo not in builders:
            raise KeyError(f"{paper_config}: {repo}@{commit} has no replica: add a builder to "
                           "beds.mirror._public_row_builders")
        write, gated = builders[repo]
        write(out / "hub" / repo)
        repos[repo] = {"revision": commit, "gated": gated}
    return repos


def build_mirror(out: str | Path, seed: int = 0, manifest: str | Path = MANIFEST,
                 paper_config: str | Path = PAPER_CONFIG) -> Path:
    """Write the mirror into `out` (replaced if it exists); returns `out`."""
    out = Path(out)
    entries = load_manifest(manifest)
    if out.exists():
        shutil.rmtree(out)
    (out / "hub").mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        repos: dict[str, dict] = {}
        hub = _hub_builders(seed)
        for e in entries:
            if not e.repo or e.repo in repos:
                continue
            if e.repo not in hub:
                raise KeyError(f"no replica for hub repo {e.repo}: add a builder to beds.mirror")
            hub[e.repo](out / "hub" / e.repo)
            repos[e.repo] = {"revision": e.revision or hashlib.sha1(e.repo.encode()).hexdigest(), "gated": e.gated}
        repos.update(_build_public_rows(out, seed, paper_config))
        urls = _url_builders(seed, tmp)
        for e in entries:
            if e.repo:
                continue
            dest = out / "urls" / url_path(e.url)
            dest.parent.mkdir(parents=True, exist_ok=True)
            urls[_url_key(e.url, urls)](dest)
    for e in entries:
        where = out / "hub" / e.repo / e.remote if e.repo else out / "urls" / url_path(e.url)
        if not where.is_file():
            raise FileNotFoundError(f"mirror replica of {e.group}/{e.path} was not written ({where})")
    index = {"seed": seed, "version": REPLICA_VERSION, "repos": repos}
    (out / "mirror.json").write_text(json.dumps(index, indent=1, sort_keys=True))
    (out / "manifest.yaml").write_text(yaml.safe_dump(mirror_manifest(out, manifest), sort_keys=False))
    replicas_hps.write_hps_config(out / f"{HPS_ARCH}.json")
    return out


def mirror_manifest(out: Path, manifest: str | Path = MANIFEST) -> dict:
    """The packaged manifest with each size/sha256 set to the replica's (revisions kept; the
    real files' git_blob / sha256_prefix pins dropped: a replica has other bytes)."""
    data = yaml.safe_load(Path(manifest).read_text(encoding="utf-8"))
    for spec in data["groups"].values():
        for f in spec.get("files") or []:
            f.pop("git_blob", None), f.pop("sha256_prefix", None)
            f["size"], f["sha256"] = _digest(out / "urls" / url_path(f["url"]))
        for repo in spec.get("hub") or []:
            for f in repo["files"]:
                f["size"], f["sha256"] = _digest(out / "hub" / repo["repo"] / f["path"])
    return data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m beds.mirror", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--manifest", default=str(MANIFEST))
    args = p.parse_args(argv)
    out = build_mirror(args.out, args.seed, args.manifest)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"mirror written to {out} ({size / 1e6:.1f} MB); serve it with "
          f"`python -m beds.mirror_server {out}`")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
