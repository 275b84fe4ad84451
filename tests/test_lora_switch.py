"""Adapter switching in O(1) Python work, with peft's own switching as the reference."""

from __future__ import annotations

import pytest
import torch

from marble.models.lora import adapters_disabled, use_adapter


@pytest.fixture(scope="module")
def model():
    from marble.models import load_pipeline
    from marble.models.lora import add_lora_adapters

    pipe = load_pipeline("random:tiny", dtype=torch.float32, device=torch.device("cpu"))
    tr = pipe.transformer
    add_lora_adapters(tr, rank=2, alpha=4, targets=["to_q", "to_k", "to_v", "to_out.0"], seed=0)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():  # B starts at 0: make "default" and "old" differ from the base
        for name, p in tr.named_parameters():
            if "lora_B" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
    g = torch.Generator().manual_seed(4)
    args = dict(hidden_states=torch.randn(2, 16, 8, 8, generator=g),
                timestep=torch.tensor([500.0, 250.0]),
                encoder_hidden_states=torch.randn(2, 9, tr.config.joint_attention_dim, generator=g),
                pooled_projections=torch.randn(2, tr.config.pooled_projection_dim, generator=g),
                return_dict=False)
    return tr, args


def _v(tr, args):
    with torch.no_grad():
        return tr(**args)[0]


def test_switching_equals_peft_set_adapter_and_disable(model):
    tr, args = model
    reference = {}
    for name in ("old", "default"):
        tr.set_adapter(name)  # peft's own path (walks every module)
        reference[name] = _v(tr, args)
    tr.disable_adapters()
    reference["base"] = _v(tr, args)
    tr.enable_adapters()
    tr.set_adapter("default")
    assert (reference["old"] - reference["default"]).abs().max() > 1e-3
    assert (reference["base"] - reference["default"]).abs().max() > 1e-3
    for _ in range(2):  # and again after the shared list is installed
        with use_adapter(tr, "old"):
            torch.testing.assert_close(_v(tr, args), reference["old"], rtol=0, atol=1e-6)
            with adapters_disabled(tr):
                torch.testing.assert_close(_v(tr, args), reference["base"], rtol=0, atol=1e-6)
            torch.testing.assert_close(_v(tr, args), reference["old"], rtol=0, atol=1e-6)
        torch.testing.assert_close(_v(tr, args), reference["default"], rtol=0, atol=1e-6)
    tr.set_adapter("old")  # peft switching again in between: still honoured
    with use_adapter(tr, "default"):
        torch.testing.assert_close(_v(tr, args), reference["default"], rtol=0, atol=1e-6)
    torch.testing.assert_close(_v(tr, args), reference["old"], rtol=0, atol=1e-6)
    tr.set_adapter("default")


def test_switch_walks_no_module_and_keeps_only_default_trainable(model, monkeypatch):
    from marble.models.lora import _fix_requires_grad

    tr, _ = model
    _fix_requires_grad(tr)
    with use_adapter(tr, "old"):
        pass  # the first switch may install the shared list
    walks = []
    original = type(tr).named_modules
    monkeypatch.setattr(type(tr), "named_modules",
                        lambda self, *a, **k: (walks.append(1), original(self, *a, **k))[1])
    for _ in range(50):
        with use_adapter(tr, "old"), adapters_disabled(tr):
            pass
    assert walks == []  # O(1): no walk over the 200-odd LoRA modules per switch
    grads = {n.split(".")[-2]: p.requires_grad for n, p in tr.named_parameters() if "lora_" in n}
    assert grads == {"default": True, "old": False}
    with pytest.raises(KeyError, match="'nope' is not on the transformer"):
        with use_adapter(tr, "nope"):
            pass


def test_peft_is_bounded_to_the_versions_the_switch_was_checked_on():
    """The switch writes peft's private `_active_adapter`: pyproject.toml must bound peft above
    (a new peft may rename it) and the installed peft, the one the tests above ran on, be inside."""
    import tomllib
    from importlib import metadata
    from pathlib import Path

    from packaging.requirements import Requirement

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    peft = next(Requirement(r) for r in project["project"]["dependencies"] if r.startswith("peft"))
    assert any(spec.operator in ("<", "<=", "==", "~=") for spec in peft.specifier), peft
    assert peft.specifier.contains(metadata.version("peft")), (peft, metadata.version("peft"))
