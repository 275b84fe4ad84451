"""The trainer's micro-step on a synthetic batch: what `marble bench step` times and
`marble bench flops` counts (one definition, so both measure the step training runs)."""

from __future__ import annotations

from marble.training.microstep import MicroBatch, run_micro_step


def one_micro_step(pipe, cfg, batch, balancer, params, autocast, micro_index: int = 1) -> dict:
    """The trainer's micro-step (`marble.training.microstep.run_micro_step`) on the
    synthetic batch; its metrics (device scalars). `autocast` is a `marble.runtime.precision.Precision`:
    under fp16 its GradScaler scales the backward passes as in training."""
    micro = MicroBatch(x0=batch["x0"], x_t=batch["x_t"], sigma=batch["sigma"],
                       prompt_embeds=batch["embeds"], pooled=batch["pooled"],
                       advantages=batch["adv"], avg_advantage=batch["avg_adv"],
                       reward_present=batch.get("present"))
    return run_micro_step(pipe.transformer, micro, cfg.train, params, autocast, balancer,
                          scale=1.0, global_step=1, micro_index=micro_index,
                          grad_scaler=getattr(autocast, "scaler", None))
