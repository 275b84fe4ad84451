"""Evaluation internals behind `marble evaluate` (CLI in `marble/evaluate.py`).

- `datasets`: the four datasets and their reference reward sets (torch-free).
- `prompts`: benchmark prompt files, per-sample seeds, rank sharding.
- `results`: the results jsonl (append, dedupe), averages, GenEval summary, run identity.
- `checkpoints`: resolve `--checkpoint_path` to a LoRA folder.
- `runner`: load the pipeline, generate, score, gather to rank 0.
"""
