"""The local mirror: every manifest entry downloads through the real downloader (plain URLs
via --mirror, hub repos via huggingface_hub + HF_ENDPOINT) from a loopback server, lands
where the workflow rules expect it, and loads with the real loading code."""

from __future__ import annotations

import hashlib
import shutil

import pytest
import yaml

from marble.assets.manifest import AccessDenied, DownloadError, group_dirs, load_manifest
from marble.assets.download import main as download_main
from beds.mirror import build_mirror
from beds.mirror_server import MirrorServer


@pytest.fixture(scope="module")
def mirror_dir(tmp_path_factory):
    return build_mirror(tmp_path_factory.mktemp("mirror") / "m", seed=0)


@pytest.fixture
def hub_env(tmp_path, monkeypatch):
    """No stored token, a private HF cache, no offline flags from the caller's shell."""
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "MARBLE_MIRROR", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def served(mirror_dir, hub_env):
    with MirrorServer(mirror_dir, idle_s=120) as server:
        hub_env.setenv("HF_ENDPOINT", server.url)
        hub_env.setenv("MARBLE_MIRROR", server.url)
        yield server


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_entry_downloads_into_the_rule_folders_and_loads(mirror_dir, served, hub_env, tmp_path):
    served_manifest = mirror_dir / "manifest.yaml"  # `served` set HF_ENDPOINT and MARBLE_MIRROR
    hub_env.setenv("HF_TOKEN", "hf_mirror")  # the SD3.5 repo is gated on the mirror too
    root = tmp_path / "data"
    # One call per rule, as workflow/rules/download.smk runs them: --out is the rule's folder.
    dirs = {"model": root / "models/sd35m", "rewards": root / "reward_ckpts", "datasets": root / "raw"}
    for group, out in dirs.items():
        assert download_main([group, "--out", str(out), "--manifest", str(served_manifest), "--backoff", "0"]) == 0
    hub_env.delenv("HF_TOKEN")
    entries = load_manifest(served_manifest)
    assert len(entries) == len(load_manifest())  # the same entries as the packaged manifest
    for e in entries:
        dest = dirs[e.group] / e.path
        assert dest.is_file() and dest.stat().st_size == e.size and _sha(dest) == e.sha256, e.path
    assert not list(root.rglob(".marble-download")) and not list(root.rglob("*.part"))
    # a second run finds everything, and --offline agrees
    assert download_main(["all", "--root", str(root), "--manifest", str(served_manifest), "--offline"]) == 0
    assert group_dirs() == {"model": "models/sd35m", "rewards": "reward_ckpts", "datasets": "raw"}

    from marble.models.loading import load_pipeline

    pipe = load_pipeline(str(dirs["model"]))
    assert type(pipe).__name__ == "StableDiffusion3Pipeline"
    assert pipe.text_encoder_3 is not None and pipe.tokenizer.model_max_length == 77


def test_scorers_load_the_downloaded_folders(mirror_dir, tmp_path):
    """The rewards' own loaders on the replicas, through marble.assets.hub.local_model."""
    import torch

    from marble.assets.hub import local_model
    from marble.rewards.clip_family import Aesthetic, PickScore

    ckpts = tmp_path / "reward_ckpts"
    for e in load_manifest(mirror_dir / "manifest.yaml"):
        if e.group == "rewards":
            src = mirror_dir / ("hub/" + e.repo + "/" + e.remote if e.repo else "urls/" + e.url.split("://")[1])
            (ckpts / e.path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, ckpts / e.path)
    images, prompts = torch.rand(2, 3, 32, 32), ["a red apple", "a blue car"]
    pick = PickScore(model=local_model("yuvalkirstain/PickScore_v1", ckpts),
                     processor=local_model("laion/CLIP-ViT-H-14-laion2B-s32B-b79K", ckpts))
    assert torch.isfinite(pick(images, prompts)).all()
    aesthetic = Aesthetic(model=local_model("openai/clip-vit-large-patch14", ckpts), ckpt_dir=str(ckpts))
    assert torch.isfinite(aesthetic(images, prompts)).all()
    from transformers import BertTokenizer

    bert = BertTokenizer.from_pretrained(local_model("bert-base-uncased", ckpts))
    assert bert("a red car").input_ids[0] == bert.cls_token_id
    names = (ckpts / "geneval/object_names.txt").read_text().splitlines()
    assert len(names) == 80 and {"computer mouse", "tv remote", "computer keyboard"} <= set(names)
    state = torch.load(ckpts / "ImageReward.pt", map_location="cpu", weights_only=True)
    assert "mlp.layers.0.weight" in state
    hps = torch.load(ckpts / "HPS_v2.1_compressed.pt", map_location="cpu", weights_only=True)
    assert "visual.conv1.weight" in hps["state_dict"]
    with pytest.raises(FileNotFoundError, match="marble download rewards"):
        local_model("openai/clip-vit-large-patch14", tmp_path / "empty")
    assert local_model("someone/else") == "someone/else"


def _subset(mirror_dir, tmp_path, corrupt: str):
    """A manifest of one hub repo and one URL, and a copy of the mirror with `corrupt` damaged."""
    data = yaml.safe_load((mirror_dir / "manifest.yaml").read_text())
    rewards = data["groups"]["rewards"]
    small = {"groups": {"rewards": {"dir": "reward_ckpts",
                                    "files": [f for f in rewards["files"] if f["path"].endswith("object_names.txt")],
                                    "hub": [h for h in rewards["hub"]
                                            if h["repo"] == "google-bert/bert-base-uncased"]}}}
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(yaml.safe_dump(small))
    copy = tmp_path / "mirror"
    shutil.copytree(mirror_dir, copy)
    target = copy / corrupt
    target.write_bytes(target.read_bytes()[:-2] + b"!\n")  # same size, other bytes
    return manifest, copy


@pytest.mark.parametrize("corrupt,name", [
    ("hub/google-bert/bert-base-uncased/vocab.txt", "vocab.txt"),
    ("urls/raw.githubusercontent.com/djghosh13/geneval/af4902f24d3ca90ebbb446dd9891a59e0f82725f"
     "/evaluation/object_names.txt", "object_names.txt"),
])
def test_a_corrupted_file_fails_its_checksum_and_leaves_nothing(mirror_dir, hub_env, tmp_path, capsys, corrupt, name):
    manifest, copy = _subset(mirror_dir, tmp_path, corrupt)
    out = tmp_path / "reward_ckpts"
    with MirrorServer(copy, idle_s=60) as server:
        hub_env.setenv("HF_ENDPOINT", server.url)
        rc = download_main(["rewards", "--out", str(out), "--manifest", str(manifest),
                            "--mirror", server.url, "--retries", "0"])
    err = capsys.readouterr().err
    assert rc == 1 and "checksum error" in err and name in err
    bad = [e for e in load_manifest(manifest) if e.path.endswith(name)][0]
    assert not (out / bad.path).exists() and not (out / (bad.path + ".part")).exists()
    assert not (out / ".marble-download").exists()


def test_gated_model_without_token_names_the_token_and_the_licence(mirror_dir, served, tmp_path, monkeypatch):
    page = "https://huggingface.co/stabilityai/stable-diffusion-3.5-medium"
    # through the mirror: the server answers 401 GatedRepo, as the hub does
    with pytest.raises(AccessDenied) as info:
        from marble.assets.download import fetch_group

        sd3 = [e for e in load_manifest(mirror_dir / "manifest.yaml") if e.group == "model"]
        fetch_group(sd3, tmp_path / "sd35m")
    assert "HF_TOKEN is not set" in str(info.value) and page in str(info.value)
    assert not any((tmp_path / "sd35m").rglob("*.safetensors"))
    # against the real hub: refused before any request (no network needed)
    monkeypatch.delenv("HF_ENDPOINT")
    assert download_main(["model", "--out", str(tmp_path / "x")]) == 1


def test_gated_message_on_the_cli(hub_env, tmp_path, capsys):
    assert download_main(["model", "--out", str(tmp_path / "sd35m")]) == 1
    err = capsys.readouterr().err
    assert "HF_TOKEN is not set" in err and "accept the licence at https://huggingface.co/stabilityai" in err
    assert not (tmp_path / "sd35m").exists() or not any((tmp_path / "sd35m").iterdir())


def test_replicas_are_deterministic(mirror_dir, tmp_path):
    from beds import replicas, replicas_hps

    replicas.clip_repo(tmp_path / "clip", seed=3)
    replicas_hps.hps_repo(tmp_path / "hps", seed=4)
    for name in ("model.safetensors", "vocab.json", "preprocessor_config.json"):
        assert _sha(tmp_path / "clip" / name) == _sha(mirror_dir / "hub/openai/clip-vit-large-patch14" / name)
    assert _sha(tmp_path / "hps/HPS_v2.1_compressed.pt") == _sha(mirror_dir / "hub/xswu/HPSv2/HPS_v2.1_compressed.pt")


def test_unpinned_hub_entries_print_what_to_pin(mirror_dir, served, tmp_path, capsys):
    """revision/size/sha256 null: resolved from the hub's listing and printed to paste in."""
    spec = {"groups": {"rewards": {"dir": "reward_ckpts", "hub": [
        {"repo": "google-bert/bert-base-uncased", "into": "hub/google-bert/bert-base-uncased",
         "files": [{"path": "vocab.txt"}, {"path": "config.json"}]}]}}}
    manifest = tmp_path / "m.yaml"
    manifest.write_text(yaml.safe_dump(spec))
    out = tmp_path / "ck"
    assert download_main(["rewards", "--out", str(out), "--manifest", str(manifest)]) == 0
    text = capsys.readouterr()
    pinned = yaml.safe_load((mirror_dir / "mirror.json").read_text())["repos"]["google-bert/bert-base-uncased"]
    assert f"pin `revision: {pinned['revision']}`" in text.err
    vocab = out / "hub/google-bert/bert-base-uncased/vocab.txt"
    assert f"sha256 {_sha(vocab)}" in text.err and "unpinned" in text.out
    assert vocab.read_bytes() == (mirror_dir / "hub/google-bert/bert-base-uncased/vocab.txt").read_bytes()


def test_a_missing_file_at_the_pinned_commit_is_named(mirror_dir, served, tmp_path):
    spec = {"groups": {"rewards": {"hub": [{"repo": "xswu/HPSv2", "revision": "0" * 40,
                                            "files": [{"path": "HPS_v2.1_compressed.pt"}]}]}}}
    manifest = tmp_path / "m.yaml"
    manifest.write_text(yaml.safe_dump(spec))
    from marble.assets.download import fetch_group

    with pytest.raises(DownloadError, match="xswu/HPSv2@0000000000000000000000000000000000000000: RevisionNotFound"):
        fetch_group(load_manifest(manifest), tmp_path / "ck")
    spec["groups"]["rewards"]["hub"][0].update(revision=None, files=[{"path": "HPS_v9.pt"}])
    manifest.write_text(yaml.safe_dump(spec))
    with pytest.raises(DownloadError, match=r"no such file\(s\) \['HPS_v9.pt'\]"):
        fetch_group(load_manifest(manifest), tmp_path / "ck")


def test_hps_replica_loads_through_the_hpsv2_reward(mirror_dir, tmp_path):
    """Needs open_clip (the clip extra: `make test-clip` environment)."""
    pytest.importorskip("open_clip")
    import torch

    from marble.rewards.hpsv2 import HPSv2
    from beds.mirror import HPS_ARCH

    reward = HPSv2(ckpt_dir=str(mirror_dir / "hub/xswu/HPSv2"), arch=HPS_ARCH,
                   model_config=str(mirror_dir / f"{HPS_ARCH}.json"))
    assert torch.isfinite(reward(torch.rand(2, 3, 32, 32), ["a cat", "a dog"])).all()


def test_table1_public_rows_are_served_at_the_commits_paper_yaml_pins(mirror_dir, served, hub_env, tmp_path):
    """The public rows paper-mini evaluates (SD-XL, FLUX.1-Dev, SD3.5-L, the FlowGRPO PickScore
    LoRA) come through the workflow's own fetch (`python -m marble.assets.hub REF --out DIR
    --require-commit [--pipeline]`) at config/paper.yaml's commits, and load as evaluation does."""
    import json

    import torch

    from marble.assets.hub import main as hub_main
    from marble.models.loading import load_pipeline, load_text_to_image
    from marble.models.lora import adapters_disabled, load_lora_into_pipeline
    from beds.mirror import pinned_public_rows

    pins = pinned_public_rows()
    served_repos = json.loads((mirror_dir / "mirror.json").read_text())["repos"]
    assert {repo: served_repos[repo]["revision"] for repo in pins} == pins
    # 3 base models and 2 LoRAs (FlowGRPO PickScore, DiffusionNFT multi-reward); GenEval: PIN-A-COMMIT
    assert len(pins) == 5 and "jieliu/SD3.5M-FlowGRPO-GenEval" not in served_repos
    hub_env.setenv("HF_TOKEN", "hf_mirror")  # SD3.5-L and FLUX.1-Dev are gated, on the mirror too
    kinds = {"stabilityai/stable-diffusion-xl-base-1.0": "StableDiffusionXLPipeline",
             "black-forest-labs/FLUX.1-dev": "FluxPipeline",
             "stabilityai/stable-diffusion-3.5-large": "StableDiffusion3Pipeline"}
    for repo, kind in kinds.items():
        out = tmp_path / repo.replace("/", "--")
        assert hub_main([f"hf:{repo}@{pins[repo]}", "--out", str(out), "--require-commit", "--pipeline"]) == 0
        assert type(load_text_to_image(str(out))).__name__ == kind
    lora = tmp_path / "lora"
    repo = "jieliu/SD3.5M-FlowGRPO-PickScore"
    assert hub_main([f"hf:{repo}@{pins[repo]}", "--out", str(lora), "--require-commit"]) == 0
    assert sorted(p.name for p in lora.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    pipe = load_lora_into_pipeline(load_pipeline(str(mirror_dir / "hub/stabilityai/stable-diffusion-3.5-medium")), lora)

    def latents():
        return pipe(prompt=["a red car"], num_inference_steps=2, height=32, width=32, output_type="latent",
                    generator=torch.Generator().manual_seed(0)).images

    with_lora = latents()
    with adapters_disabled(pipe.transformer):
        assert not torch.allclose(with_lora, latents())  # the LoRA changes the images
