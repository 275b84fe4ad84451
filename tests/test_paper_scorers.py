"""The paper scorers as `make test-paper` runs them: real classes, loading the downloaded folders
only (no hub at run time), GenEval's stand-in detector and UnifiedReward's fake sglang server."""

from __future__ import annotations

import shutil
import time

import numpy as np
import pytest
import torch

from marble.assets.manifest import load_manifest
from marble.rewards import build
from beds import replicas, replicas_hps

REWARD_REPOS = ("yuvalkirstain/PickScore_v1", "laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
                "openai/clip-vit-large-patch14", "google-bert/bert-base-uncased", "zai-org/ImageReward", "xswu/HPSv2")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """A reward-checkpoint dir laid out as `marble download rewards` leaves it (tiny replicas)."""
    from beds.mirror import _hub_builders

    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("reward_ckpts")
    builders = _hub_builders(0)
    for repo in REWARD_REPOS:
        builders[repo](src / repo)
    for e in load_manifest():
        if e.group == "rewards" and e.repo in REWARD_REPOS:
            (out / e.path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / e.repo / e.remote, out / e.path)
    replicas.aesthetic_head(out / "sac+logos+ava1-l14-linearMSE.pth", 6)
    (out / "geneval").mkdir()
    replicas.object_names(out / "geneval/object_names.txt")
    replicas_hps.write_hps_config(out / "marble-tiny-hps.json")
    return out


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """A compute node: no hub (offline flag, an endpoint nothing listens on, an empty cache)."""
    import huggingface_hub.constants as hf_constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    return monkeypatch


COUNT_PERSONS = {"tag": "counting", "include": [{"class": "person", "count": 2}]}


def test_paper_scorers_read_the_downloaded_folders_by_their_hub_ids(ckpts, offline):
    offline.setenv("MARBLE_REWARD_CKPTS", str(ckpts))  # as the workflow rules set it
    images, prompts = torch.rand(2, 3, 32, 32), ["a photo of a red car", "a dog"]
    for name in ("pickscore", "clipscore", "aesthetic", "imagereward"):
        scores = build(name)(images, prompts)  # default hub ids, no model paths given
        assert scores.shape == (2,) and torch.isfinite(scores).all(), name
    geneval = build("geneval", detector="stub")
    black = torch.zeros(1, 3, 32, 32)  # both halves sum to 0: two `person`s (the stub's rule)
    assert geneval(black, ["a photo of two persons"], [COUNT_PERSONS]).tolist() == [1.0]
    colour = {"tag": "colors", "include": [{"class": "person", "count": 2, "color": "red"}]}
    detail = geneval.evaluate_detail(black, [colour])[0]  # the real CLIP colour classifier, local copy
    assert detail["score"] in (0.5, 0.75, 1.0)  # count credit 1, colour credit 0, 1/2 or 1
    assert type(geneval.color_classifier).__name__ == "ClipColorClassifier"


def test_hpsv2_reads_the_downloaded_checkpoint(ckpts, offline):
    pytest.importorskip("open_clip", reason="HPSv2.1 needs open_clip (make test-clip / test-paper env)")
    from beds.mirror import replica_reward_options

    options = replica_reward_options(ckpts)["hpsv2"]
    scores = build("hpsv2", ckpt_dir=str(ckpts), **options)(torch.rand(2, 3, 32, 32), ["a red car", "a dog"])
    assert scores.shape == (2,) and torch.isfinite(scores).all() and scores.abs().max() <= 1


def test_a_missing_download_names_the_command(tmp_path, offline):
    with pytest.raises(FileNotFoundError, match="marble download rewards"):
        build("pickscore", ckpt_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="marble download rewards"):
        build("imagereward", ckpt_dir=str(tmp_path))


class NoColours:
    """A colour classifier with the real call signature; counting prompts never call it."""

    def __call__(self, image_rgb, objects, classname):
        raise AssertionError("counting prompts need no colours")


def test_stub_detector_is_the_documented_deterministic_rule(ckpts):
    from marble.rewards.geneval_stub import StubDetector

    names = (ckpts / "geneval/object_names.txt").read_text().split("\n")[:-1]
    image = np.zeros((8, 9, 3), dtype=np.uint8)
    image[0, 0, 0] = 1  # left half sums to 1 -> class 1; right half (5 columns) to 0 -> class 0
    (found,) = StubDetector(names).detect([image])
    assert sorted(found) == ["bicycle", "person"]
    assert found["bicycle"].boxes.tolist() == [[0, 0, 4, 8]] and found["person"].boxes.tolist() == [[4, 0, 9, 8]]
    assert found["person"].masks[0][:, 4:].all() and not found["person"].masks[0][:, :4].any()
    reward = build("geneval", detector="stub", ckpt_dir=str(ckpts), color_classifier=NoColours())
    image_t = torch.from_numpy(image).permute(2, 0, 1)[None].float() / 255
    one_each = {"tag": "two_object", "include": [{"class": "bicycle", "count": 1}, {"class": "person", "count": 1}]}
    assert reward(image_t.repeat(2, 1, 1, 1), ["p", "q"], [one_each, COUNT_PERSONS]).tolist() == [1.0, 0.5]


def test_detector_option_names_the_choices(ckpts, tmp_path):
    with pytest.raises(ValueError, match="'mmdet' or 'stub'"):
        build("geneval", detector="yolo", ckpt_dir=str(ckpts))
    with pytest.raises(FileNotFoundError, match="object_names.txt"):
        build("geneval", detector="stub", ckpt_dir=str(tmp_path))


def test_unifiedreward_against_the_fake_sglang_server(monkeypatch):
    from marble.rewards.unifiedreward import QUESTION
    from beds.fake_sglang import FakeSglangServer, judge_score

    prompts = ["a red apple", "a cat on a sofa", "a red apple"]
    with FakeSglangServer(idle_s=60) as server:
        monkeypatch.setenv("MARBLE_UNIFIEDREWARD_URL", server.url)
        scores = build("unifiedreward")(torch.rand(3, 3, 16, 16), prompts)
        assert server.requests == 3
    want = [judge_score(QUESTION.format(prompt=p)) / 5 for p in prompts]
    assert scores.tolist() == pytest.approx(want) and scores[0] == scores[2]


def test_fake_sglang_server_stops_by_itself_when_idle():
    from beds.fake_sglang import FakeSglangServer

    server = FakeSglangServer(idle_s=0.3)
    with server:
        deadline = time.monotonic() + 10
        while server._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not server._thread.is_alive()
