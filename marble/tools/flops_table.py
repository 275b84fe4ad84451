"""`python -m marble.tools.flops_table --write`: count the FLOPs the GPU-hour plan prices with.

    python -m marble.tools.flops_table --write     # marble/workflow/flops_table.json (~20 min, any CPU)

Everything is counted on meta tensors with `marble bench flops`'s machinery (FlopCounterMode,
its autocast emulation, fused attention): per training shape, one micro-step of every
balancer row (`bench_flops`, the trainer's own micro-step) and the sampling of one rollout
image (`marble.models.sampling.sample_latents` on the preset's LoRA transformer); per
evaluated model, one denoiser forward per sample, the VAE decode and the text encoders. The
shapes counted are those of every preset and of every workflow config in this repository
(`needed`); the plan names any other shape as not counted. Next to each full-size figure
the table keeps a fingerprint, the same count at depth 1 (seconds), which
tests/test_flops_table.py recounts: a change to the counted code fails it until the table is
regenerated.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from marble.config import load_config
from marble.runtime import install
from marble.tools.bench_flops import MetaAutocast, bench_flops, default_rows, meta_transformer
from marble.workflow import flops as wf_flops

ROOT = Path(__file__).resolve().parents[2]
# Public config.json values of the evaluated base models that are not trained here.
SD35L_CONFIG = dict(sample_size=128, patch_size=2, in_channels=16, out_channels=16, num_layers=38,
                    attention_head_dim=64, num_attention_heads=38, joint_attention_dim=4096,
                    caption_projection_dim=2432, pooled_projection_dim=2048, pos_embed_max_size=192,
                    qk_norm="rms_norm")
FLUX_DEV_CONFIG = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38,
                       attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
                       pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56))
SDXL_UNET_CONFIG = dict(
    sample_size=128, in_channels=4, out_channels=4, layers_per_block=2,
    block_out_channels=(320, 640, 1280), attention_head_dim=(5, 10, 20),
    transformer_layers_per_block=(1, 2, 10), cross_attention_dim=2048,
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
    use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=256,
    projection_class_embeddings_input_dim=2816)
SDXL_VAE_CONFIG = dict(in_channels=3, out_channels=3, latent_channels=4,
                       down_block_types=("DownEncoderBlock2D",) * 4,
                       up_block_types=("UpDecoderBlock2D",) * 4,
                       block_out_channels=(128, 256, 512, 512), layers_per_block=2,
                       norm_num_groups=32, sample_size=1024)
# Text encoders: (transformers class, config, tokens).
ENCODERS = {
    "clip_l": ("CLIPTextModelWithProjection", "CLIPTextConfig",
               dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                    num_attention_heads=12, projection_dim=768), 77),
    "clip_g": ("CLIPTextModelWithProjection", "CLIPTextConfig",
               dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32,
                    num_attention_heads=20, projection_dim=1280), 77),
    **{f"t5_xxl@{n}": ("T5EncoderModel", "T5Config",
                       dict(d_model=4096, d_ff=10240, d_kv=64, num_heads=64, num_layers=24,
                            feed_forward_proj="gated-gelu", vocab_size=32128), n)
       for n in (256, 512)},
}
FINGERPRINT_ROWS = ("weighted_sum", "mgda")  # a plain and a full-solve micro-step
META = {"device": "meta"}


def count(fn, dtype=torch.float16) -> int:
    """FLOPs of `fn()` on meta tensors under the autocast emulation (no grad unless fn asks)."""
    from marble.tools.counting import flop_counter


    with flop_counter() as flops, MetaAutocast(dtype):
        fn()
    return int(flops.get_total_flops())


def _e(*shape):
    return torch.empty(*shape, **META)


def denoiser(arch: str, depth: int | None = None):
    """The evaluated base model's denoiser on meta (no LoRA: a merged or absent adapter)."""
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel, UNet2DConditionModel

    from marble.models.tiny import SD35M_TRANSFORMER_CONFIG, TINY_TRANSFORMER_CONFIG

    configs = {"tiny": TINY_TRANSFORMER_CONFIG, "sd35m": SD35M_TRANSFORMER_CONFIG,
               "sd35l": SD35L_CONFIG, "flux_dev": FLUX_DEV_CONFIG, "sdxl": SDXL_UNET_CONFIG}
    config = dict(configs[arch])
    if depth is not None and arch != "sdxl":  # the fingerprint: one block of each kind
        config["num_layers"] = depth
        if "num_single_layers" in config:
            config["num_single_layers"] = depth
        if "dual_attention_layers" in config:
            config["dual_attention_layers"] = tuple(i for i in config["dual_attention_layers"]
                                                    if i < depth)
    cls = {"flux_dev": FluxTransformer2DModel, "sdxl": UNet2DConditionModel}.get(
        arch, SD3Transformer2DModel)
    with torch.device("meta"):
        return cls(**config).requires_grad_(False)


def forward_flops(arch: str, resolution: int, text_tokens: int, depth: int | None = None) -> int:
    """One sample's denoiser forward at evaluation (batch 1, no grad)."""
    model = denoiser(arch, depth)
    side = resolution // 8
    if arch == "flux_dev":  # packed 2x2 latent patches, 16 channels each
        n = (side // 2) ** 2
        kwargs = dict(hidden_states=_e(1, n, 64), encoder_hidden_states=_e(1, text_tokens, 4096),
                      pooled_projections=_e(1, 768), timestep=_e(1), guidance=_e(1),
                      img_ids=_e(n, 3), txt_ids=_e(text_tokens, 3))
    elif arch == "sdxl":
        kwargs = dict(sample=_e(1, 4, side, side), timestep=_e(1),
                      encoder_hidden_states=_e(1, text_tokens, 2048),
                      added_cond_kwargs={"text_embeds": _e(1, 1280), "time_ids": _e(1, 6)})
    else:
        c = model.config
        kwargs = dict(hidden_states=_e(1, c.in_channels, side, side), timestep=_e(1),
                      encoder_hidden_states=_e(1, text_tokens, c.joint_attention_dim),
                      pooled_projections=_e(1, c.pooled_projection_dim))
    with torch.no_grad():
        return count(lambda: model(**kwargs, return_dict=False))


def vae_decode_flops(vae: str, resolution: int) -> int:
    """Decoding one image's latent."""
    from diffusers import AutoencoderKL

    from marble.models.tiny import SD35M_VAE_CONFIG, TINY_VAE_CONFIG

    config = {"sd3": SD35M_VAE_CONFIG, "sdxl": SDXL_VAE_CONFIG, "tiny": TINY_VAE_CONFIG}[vae]
    with torch.device("meta"):
        model = AutoencoderKL(**config).requires_grad_(False)
    side = resolution // 8
    with torch.no_grad():
        return count(lambda: model.decode(_e(1, config["latent_channels"], side, side)),
                     torch.float32)


def encoder_flops(name: str) -> int:
    """Encoding one prompt with this text encoder."""
    import transformers

    cls, cfg_cls, config, tokens = ENCODERS[name]
    with torch.device("meta"):
        model = getattr(transformers, cls)(getattr(transformers, cfg_cls)(**config))
    ids = torch.zeros(1, tokens, dtype=torch.long, **META)
    with torch.no_grad():
        return count(lambda: model(input_ids=ids))


def rollout_flops(cfg, depth: int | None = None) -> int:
    """Sampling one rollout image with the run's sampler on its LoRA transformer."""
    from marble.models.sampling import sample_latents

    transformer, _ = meta_transformer(cfg, depth)
    c, s = transformer.config, cfg.sampling
    side = s.resolution // 8
    text = 77 + cfg.model.max_sequence_length
    negative = (_e(1, text, c.joint_attention_dim), _e(1, c.pooled_projection_dim))
    sigmas = torch.linspace(1.0, 0.0, s.num_steps + 1)  # values do not change a count
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(cfg.model.mixed_precision)
    with torch.no_grad():
        return count(lambda: sample_latents(
            transformer, _e(1, c.in_channels, side, side), negative[0], negative[1], sigmas,
            s.solver, guidance_scale=s.guidance_scale or 1.0, negative=negative), dtype)


def micro_rows(cfg, rows: tuple, depth: int | None = None) -> dict:
    """{row: FLOPs of one micro-step} and `lora_params` (what a checkpoint stores)."""
    res = bench_flops(cfg, rows=rows, runs=(), num_layers=depth)
    return {"rows": {row: int(r["flops"]) for row, r in res["rows"].items()},
            "lora_params": int(res["lora_params"])}


# The workflow configs of this repository whose shapes the table counts (config/eval.yaml is
# their shared base, config/paper_published.yaml Table 1's published numbers).
WORKFLOW_CONFIGS = ("config.yaml", "config/paper.yaml", "config/table1.yaml", "config/paper-eval.yaml")


def needed(root: Path = ROOT) -> dict:
    """Every shape to count: each preset's training, and each workflow config's runs (with
    their overrides), claim runs, bench preset and evaluation rows."""
    from marble.workflow import claim as wf_claim
    from marble.workflow import configs as wf_configs
    from marble.workflow import runs as wf_runs

    rows = default_rows()
    if not any(r.startswith("zoo_") for r in rows):
        raise SystemExit(f"the table counts the balancer zoo's rows: {install.extra('zoo')} first")
    needs = {"micro_step": {}, "rollout": {}, "forward": {}, "vae_decode": {}, "encoder": set()}

    def trained(cfg, want=rows):
        key = wf_flops.micro_key(cfg)
        have = needs["micro_step"].get(key, (cfg, ()))[1]
        needs["micro_step"][key] = (cfg, tuple(dict.fromkeys((*have, *want))))
        if want is rows:  # a trained shape: its rollouts, sampled and decoded
            needs["rollout"].setdefault(wf_flops.rollout_key(cfg), cfg)
            vae = wf_flops.ARCHS[wf_flops.training_arch(cfg.model.path)].vae
            needs["vae_decode"][wf_flops.vae_key(vae, cfg.sampling.resolution)] = (
                vae, cfg.sampling.resolution)

    for path in sorted((root / "marble" / "presets").glob("*.yaml")):
        cfg = load_config(path.stem)  # a bench preset: the weighted sum its GPU bench times
        trained(cfg, ("weighted_sum",) if path.stem.startswith("bench_") else rows)
    for name in WORKFLOW_CONFIGS:
        config = wf_configs.load([name], root)
        dataset_dir = f"data/datasets/{config['dataset']['name']}"
        claim = config.get("claim") or {}  # unvalidated here: a config without claim seeds has none
        specs = {**wf_runs.configured(config["runs"]),
                 **(wf_claim.runs(claim) if claim.get("arms") and "seeds" in claim else {})}
        for spec in specs.values():
            overrides = wf_runs.run_overrides({"set": [], **spec}, config["model_dir"], dataset_dir, None)
            trained(load_config(spec["preset"], overrides=overrides))
        trained(load_config((config.get("bench") or {}).get("preset", "tiny")), ("weighted_sum",))
        for arch, res in wf_flops.eval_shapes(config, [*wf_runs.configured(config["runs"])]):
            a = wf_flops.ARCHS[arch]
            needs["forward"][wf_flops.forward_key(arch, res, a.eval_text_tokens)] = (
                arch, res, a.eval_text_tokens)
            needs["vae_decode"][wf_flops.vae_key(a.vae, res)] = (a.vae, res)
            needs["encoder"].update(a.encoders)
    needs["encoder"] = sorted(needs["encoder"])
    return needs


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def build(needs: dict | None = None) -> dict:
    """The whole table (minutes at SD3.5M size)."""
    needs = needs or needed(ROOT)
    table = {"about": __doc__.split("\n\n")[0], "regenerate": wf_flops.REGENERATE,
             "torch": torch.__version__, "micro_step": {}, "rollout": {}, "forward": {},
             "vae_decode": {}, "encoder": {}}
    for key, (cfg, rows) in needs["micro_step"].items():
        _progress(f"micro-step {key}: {len(rows)} rows")
        table["micro_step"][key] = {"preset": cfg.preset, **micro_rows(cfg, rows),
                                    "fingerprint": fingerprint("micro_step", cfg)}
    for key, cfg in needs["rollout"].items():
        _progress(f"rollout {key}")
        table["rollout"][key] = {"preset": cfg.preset, "flops": rollout_flops(cfg),
                                 "fingerprint": fingerprint("rollout", cfg)}
    for key, (arch, res, text) in needs["forward"].items():
        _progress(f"forward {key}")
        table["forward"][key] = {"flops": forward_flops(arch, res, text),
                                 "fingerprint": fingerprint("forward", (arch, res, text))}
    for key, (vae, res) in needs["vae_decode"].items():
        table["vae_decode"][key] = {"flops": vae_decode_flops(vae, res)}
    for name in needs["encoder"]:
        table["encoder"][name] = {"flops": encoder_flops(name)}
    return table


def fingerprint(section: str, what) -> dict | int:
    """The depth-1 count of an entry: what the currency test recounts in seconds."""
    if section == "micro_step":
        return micro_rows(what, FINGERPRINT_ROWS, depth=1)["rows"]
    if section == "rollout":
        return rollout_flops(what, depth=1)
    arch, res, text = what
    return forward_flops(arch, res, text, depth=None if arch == "sdxl" else 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m marble.tools.flops_table", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", action="store_true", help=f"count and write {wf_flops.TABLE_PATH}")
    p.add_argument("--out", type=Path, default=wf_flops.TABLE_PATH)
    args = p.parse_args(argv)
    if not args.write:
        p.error("--write is the only action (tests/test_flops_table.py checks the table)")
    from marble.runtime.io import write_json

    write_json(args.out, build())
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
