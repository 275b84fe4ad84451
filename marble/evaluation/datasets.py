"""The four benchmark datasets and what the reference scores each with (docs/algorithm.md §10).

Kept free of heavy imports: the workflow reads these while Snakemake builds its DAG (which
evaluations need the UnifiedReward judge), and importing `marble.rewards` would load torch
into every Snakemake invocation (3.5 s of a 6 s dry run).
"""

from __future__ import annotations

DATASETS = ("geneval", "ocr", "pickscore", "drawbench")
_SIX = ["imagereward", "pickscore", "aesthetic", "clipscore", "hpsv2"]
# MARBLE's evaluation.py: pickscore drops unifiedreward, drawbench keeps it
# (docs/algorithm.md §10).
DEFAULT_REWARDS: dict[str, list[str]] = {
    "geneval": ["geneval"],
    "ocr": ["ocr"],
    "pickscore": list(_SIX),
    "drawbench": [*_SIX, "unifiedreward"],
}
# Per-rank batch sizes of the reference script (docs/algorithm.md §10).
DEFAULT_BATCH_SIZE = {"geneval": 14, "ocr": 16, "pickscore": 16, "drawbench": 5}
# Each benchmark's prompt file under DIR/<dataset>/ (the reference's raw layout).
PROMPT_FILES = {"geneval": "test_metadata.jsonl", "ocr": "test.txt", "pickscore": "test.txt", "drawbench": "test.txt"}
