"""Pure maths of DiffusionNFT and MARBLE: no models, no files, no processes.

- `advantages`: per-prompt group advantages, one NaN-masked estimator per reward.
- `nft`: the forward-process NFT loss (implicit positive/negative policies) and the KL term.
- `flow`: the forward process x_t = (1 - sigma) x0 + sigma eps.
- `qp`: the min-norm QP over the simplex (MGDA weights from a Gram matrix).
- `ema`: weight EMA, the alpha cache EMA (rho), the old-policy decay schedule.
"""
