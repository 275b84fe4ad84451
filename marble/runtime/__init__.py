"""What every loop runs on: atomic file writes (`io`), torchrun ranks and collectives
(`distributed`), autocast / GradScaler / dtypes and the optimizer update (`precision`)."""
