"""Pure maths of DiffusionNFT and MARBLE: no models, no files, no processes.

- `advantages`: per-prompt group advantages, one NaN-masked estimator per reward.
- `nft`: the forward-process NFT loss (implicit positive/negative policies) and the KL term.
- `qp`: the min-norm QP over the simplex (MGDA weights from a Gram matrix).
- `ema`: weight EMA, the alpha cache EMA (rho), the old-policy decay schedule.
"""
