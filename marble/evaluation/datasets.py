"""The four benchmark datasets and what the reference scores each with (docs/algorithm.md §10).

Kept free of heavy imports: the workflow reads these while Snakemake builds its DAG (which
evaluations need the UnifiedReward judge); torch would cost 3.5 s of a 6 s dry run. The
reward registry loads no torch: each reward's descriptor names the datasets it scores.
"""

from __future__ import annotations

from marble.rewards import descriptors

# The datasets' one spelling outside the data layer (whose prompt sources, marble.data.assemble's
# SOURCES, are the same names, held equal by tests/test_one_definition.py): every other module
# names a dataset through these, so a reward's name counts only where it keys the reward.
GENEVAL, OCR, PICKSCORE, DRAWBENCH = DATASETS = ("geneval", "ocr", "pickscore", "drawbench")
# MARBLE's evaluation.py (docs/algorithm.md §10): each reward's descriptor's `eval_datasets`
# (pickscore drops unifiedreward, drawbench keeps it), in registration order.
DEFAULT_REWARDS: dict[str, list[str]] = {
    dataset: [d.name for d in descriptors() if dataset in d.eval_datasets] for dataset in DATASETS}
# Per-rank batch sizes of the reference script (docs/algorithm.md §10).
DEFAULT_BATCH_SIZE = {GENEVAL: 14, OCR: 16, PICKSCORE: 16, DRAWBENCH: 5}
# Each benchmark's prompt file under DIR/<dataset>/ (the reference's raw layout).
PROMPT_FILES = {GENEVAL: "test_metadata.jsonl", OCR: "test.txt", PICKSCORE: "test.txt", DRAWBENCH: "test.txt"}
