"""Per-micro-batch worst cosines of issue 37's options (`python -m beds.fresh_cosines`).

    python -m beds.fresh_cosines --batches 40 --json OUT.json

A smoke measurement, not a verdict: the `random:tiny` model of the `tiny` preset (LoRA nudged
off its zero init so every matrix has a gradient), synthetic micro-batches (`marble bench`'s
`synthetic_batch`, its mask pattern), exact masking. Per micro-batch the per-reward LoRA
gradients g_k are computed once (K backward passes), and each option's applied policy
direction is formed from them: with exact masking the single backward of sum_k w_k L_k is
sum_k w_k g_k exactly. Reported per option: the fraction of micro-batches whose direction
has cos(d, g_k) < 0 for some reward (anti-aligned), the mean and the minimum worst cosine.

- `weighted_sum`: its own backward (the mean-reward advantage).
- `marble_ref`, `marble_normcorr`: the alpha of a full solve on another micro-batch (seed
  1000), on raw gradients / in the solve's form with that solve's norms;
  `normcorr_fresh_norms`: the same alpha with this batch's norms (a refreshed-norm rule).
- `fresh_param_solve`: MARBLE's full solve on this batch (K + 1 backward passes).
- `output_unit`, `output_raw`: the output-space Gram solve (`balancer.gram_space: output`).
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext

import numpy as np
import torch

OPTIONS = ("weighted_sum", "marble_ref", "marble_normcorr", "normcorr_fresh_norms",
           "fresh_param_solve", "output_unit", "output_raw")


def _setup():
    from marble.config import load_config
    from marble.models import load_pipeline
    from marble.models.lora import add_lora_adapters, trainable_lora_parameters

    torch.manual_seed(0)
    cfg = load_config("tiny", overrides=["model.path=random:tiny"])
    pipe = load_pipeline("random:tiny", dtype=torch.float32, device=torch.device("cpu"))
    add_lora_adapters(pipe.transformer, rank=cfg.model.lora_rank, alpha=cfg.model.lora_alpha,
                      targets=cfg.model.lora_targets, seed=0)
    params = trainable_lora_parameters(pipe.transformer)
    with torch.no_grad():  # LoRA B starts at 0: a nudge so every LoRA matrix has a gradient
        for p in params:
            p.add_(0.01 * torch.randn_like(p))
    return cfg, pipe, params


def _step(cfg, pipe, params, seed: int):
    from marble.tools.bench import synthetic_batch
    from marble.training.microstep import MicroBatch, build_micro_step

    b = synthetic_batch(pipe, cfg, "cpu", seed=seed)
    mb = MicroBatch(x0=b["x0"], x_t=b["x_t"], sigma=b["sigma"], prompt_embeds=b["embeds"],
                    pooled=b["pooled"], advantages=b["adv"], avg_advantage=b["avg_adv"],
                    reward_present=b["present"])
    return build_micro_step(pipe.transformer, mb, cfg.train, params, nullcontext, scale=1.0,
                            global_step=1, micro_index=0)


def _grads(step, params, k: int):
    from marble.balancers.common import flat_grad, reward_loss, weighted_sum_loss

    return ([flat_grad(reward_loss(step, j), params).double() for j in range(k)],
            flat_grad(weighted_sum_loss(step), params).double())


def _worst(d: torch.Tensor, grads: list) -> float:
    return min(float(d @ g / (d.norm() * g.norm())) for g in grads if g.norm() > 0)


def _mix(weights, grads) -> torch.Tensor:
    return sum(float(w) * g for w, g in zip(weights, grads) if w != 0)


def measure(batches: int) -> dict:
    from marble.balancers.fresh import output_gram
    from marble.balancers.solve import combine
    from marble.maths.fresh_balance import gram_weights, unit_form_weights

    cfg, pipe, params = _setup()
    k = len(cfg.rewards)

    def solve(grads):
        gram = torch.stack(grads) @ torch.stack(grads).T
        return combine([g.float() for g in grads], gram, cfg.balancer.grad_eps)

    cached, _ = _grads(_step(cfg, pipe, params, 1000), params, k)
    _, alpha, _, norms0, valid0 = solve(cached)
    mean0 = float(norms0[valid0].mean())
    out: dict = {name: [] for name in OPTIONS}
    for seed in range(batches):
        step = _step(cfg, pipe, params, seed)
        out_gram = output_gram(step, [True] * k).numpy()
        grads, ws = _grads(step, params, k)
        fresh = np.array([float(g.norm()) for g in grads])
        dirs = {"weighted_sum": ws, "marble_ref": _mix(alpha, grads),
                "marble_normcorr": _mix(unit_form_weights(alpha, norms0, mean0), grads),
                "normcorr_fresh_norms": _mix(unit_form_weights(
                    alpha, fresh, fresh[fresh > 0].mean()), grads),
                "fresh_param_solve": solve(grads)[0].double()}
        for mode in ("unit", "raw"):
            dirs[f"output_{mode}"] = _mix(gram_weights(out_gram, cfg.balancer.grad_eps,
                                                               mode)[0], grads)
        for name, d in dirs.items():
            out[name].append(_worst(d, grads))
    return {name: {"micro_batches": len(v), "anti_aligned": float(np.mean(np.array(v) < 0)),
                   "mean_worst_cos": float(np.mean(v)), "min_worst_cos": float(np.min(v))}
            for name, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    from marble.runtime.io import write_json

    p = argparse.ArgumentParser(prog="python -m beds.fresh_cosines",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--json", default=None, help="also write the result here")
    args = p.parse_args(argv)
    res = measure(args.batches)
    if args.json:
        write_json(args.json, res)
    for name, r in res.items():
        print(f"{name:22s} anti-aligned {r['anti_aligned']:6.1%}  mean worst cos "
              f"{r['mean_worst_cos']:+.3f}  min {r['min_worst_cos']:+.3f}  ({r['micro_batches']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
