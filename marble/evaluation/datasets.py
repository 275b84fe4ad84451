"""The four benchmark datasets and what the reference scores each with (docs/algorithm.md §10).

Kept free of heavy imports: the workflow reads these while Snakemake builds its DAG (which
evaluations need the UnifiedReward judge); torch would cost 3.5 s of a 6 s dry run. The
reward registry loads no torch: each reward's descriptor names the datasets it scores.
"""

from __future__ import annotations

from marble.rewards import descriptors

DATASETS = ("geneval", "ocr", "pickscore", "drawbench")
# MARBLE's evaluation.py (docs/algorithm.md §10): each reward's descriptor's `eval_datasets`
# (pickscore drops unifiedreward, drawbench keeps it), in registration order.
DEFAULT_REWARDS: dict[str, list[str]] = {
    dataset: [d.name for d in descriptors() if dataset in d.eval_datasets] for dataset in DATASETS}
# Per-rank batch sizes of the reference script (docs/algorithm.md §10).
DEFAULT_BATCH_SIZE = {"geneval": 14, "ocr": 16, "pickscore": 16, "drawbench": 5}
# Each benchmark's prompt file under DIR/<dataset>/ (the reference's raw layout).
PROMPT_FILES = {"geneval": "test_metadata.jsonl", "ocr": "test.txt", "pickscore": "test.txt", "drawbench": "test.txt"}
