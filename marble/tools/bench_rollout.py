"""`marble bench rollout`: one rollout batch with prompts encoded vs read from the cache."""

from __future__ import annotations

import statistics
import time

__all__ = ["bench_rollout"]


def bench_rollout(cfg, table: str, repeats: int = 3, device: str | None = None,
                  model_path: str | None = None, cache_dir: str | None = None) -> dict:
    """One rollout batch (embeddings + old-policy sampling + decode), encoding the prompts
    vs reading them from the embedding cache (built in a temp folder when not given)."""
    import dataclasses
    import tempfile

    import torch

    from marble.data import load_table
    from marble.data.embed_cache import EmbeddingCache, build_cache
    from marble.models.encode import decode_latents, encode_prompts, latent_shape
    from marble.models.lora import use_adapter
    from marble.models.policy import load_policy
    from marble.models.sampling import sample_latents, sigma_schedule
    from marble.runtime.precision import DTYPES, make_precision

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    mp = cfg.model.mixed_precision if dev.type == "cuda" else "no"
    path = model_path or cfg.model.path
    # Loaded as training loads it (base transformer in model.base_dtype: fp32 by default).
    pipe, _ = load_policy(dataclasses.replace(cfg.model, mixed_precision=mp), cfg.train.seed,
                          dev, path=path)
    s, msl = cfg.sampling, cfg.model.max_sequence_length
    k = s.images_per_prompt
    uniq = load_table(table)["prompt"].tolist()[: max(1, s.batch_size // k)]
    prompts = [p for p in uniq for _ in range(k)][: s.batch_size]
    tmp = tempfile.TemporaryDirectory() if cache_dir is None else None
    cache_dir = cache_dir or tmp.name
    build_start = time.perf_counter()
    build_cache([table], path, cache_dir, max_sequence_length=msl, pipe=pipe,
                dtype=str(DTYPES[mp]).replace("torch.", ""), device=str(dev))
    build_s = time.perf_counter() - build_start
    cache = EmbeddingCache(cache_dir)
    sigmas = sigma_schedule(pipe.scheduler, s.num_steps).to(dev, torch.float32)
    noise = torch.randn((len(prompts), *latent_shape(pipe, s.resolution)),
                        generator=torch.Generator().manual_seed(0)).to(dev)
    autocast = make_precision(mp, dev)

    def one(source: str) -> float:
        start = time.perf_counter()
        with torch.no_grad():
            if source == "cache":
                emb, pooled = (t.to(dev) for t in cache.lookup(prompts))
            else:
                emb, pooled = encode_prompts(pipe, prompts, msl)
            with use_adapter(pipe.transformer, "old"), autocast():
                x0 = sample_latents(pipe.transformer, noise, emb, pooled, sigmas, s.solver)
                decode_latents(pipe, x0.float())  # under autocast, as the rollout decodes
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    times = {"encode": [], "cache": []}
    one("encode"), one("cache")  # warm-up
    for rep in range(repeats):
        for source in (("encode", "cache") if rep % 2 == 0 else ("cache", "encode")):
            times[source].append(one(source))
    if tmp is not None:
        tmp.cleanup()
    med = {src: statistics.median(v) for src, v in times.items()}
    return {"rollout": {src: {"batch_s": med[src], "batch_s_all": times[src]} for src in times},
            "ratio_cache_to_encode": med["cache"] / med["encode"], "cache_build_s": build_s,
            "batch_size": len(prompts), "num_steps": s.num_steps, "resolution": s.resolution,
            "preset": cfg.preset, "model_path": path, "device": str(dev), "repeats": repeats}
