"""The paper's published numbers, to set beside a run's (source: the MARBLE project page,
aim-uofa.github.io/MARBLE; transcribed in shared/docs/algorithm.md section E).

SD3.5-M fine-tuned on PickScore, CLIPScore, HPSv2.1, OCR and GenEval; PickScore on the
x26 scale, UnifiedReward on 1-5; composite = mean of column-wise z-scores over the 11 rows.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

from marble.evaluation.summary import PAPER_METRICS

SOURCE = "published: MARBLE project page (aim-uofa.github.io/MARBLE), Table 1"
TABLE1_COLUMNS = ["GenEval", "OCR", "PickScore", "CLIPScore", "HPSv2.1", "Aesthetic",
                  "ImgRwd", "UniRwd", "Composite"]
TABLE1 = {
    "SD-XL": [0.55, 0.14, 22.42, 0.287, 0.280, 5.60, 0.76, 2.93, -0.46],
    "SD3.5-L": [0.71, 0.68, 22.91, 0.289, 0.288, 5.50, 0.96, 3.25, 0.12],
    "FLUX.1-Dev": [0.66, 0.59, 22.84, 0.295, 0.274, 5.71, 0.96, 3.27, 0.10],
    "SD3.5-M (w/o CFG)": [0.24, 0.12, 20.51, 0.237, 0.204, 5.13, -0.58, 2.02, -2.32],
    "SD3.5-M + CFG": [0.63, 0.59, 22.34, 0.285, 0.279, 5.36, 0.85, 3.03, -0.26],
    "+ FlowGRPO (GenEval)": [0.95, 0.66, 22.51, 0.293, 0.274, 5.32, 1.06, 3.18, 0.12],
    "+ FlowGRPO (OCR)": [0.66, 0.92, 22.41, 0.290, 0.280, 5.32, 0.95, 3.15, 0.01],
    "+ FlowGRPO (PickScore)": [0.54, 0.68, 23.50, 0.280, 0.316, 5.90, 1.29, 3.37, 0.36],
    "+ DiffusionNFT (sequential)": [0.94, 0.91, 23.80, 0.293, 0.331, 6.01, 1.49, 3.49, 1.02],
    "+ DiffusionNFT (weighted-sum)": [0.92, 0.91, 21.53, 0.267, 0.300, 6.15, 1.16, 3.04, 0.18],
    "+ MARBLE": [0.94, 0.96, 22.83, 0.286, 0.355, 6.59, 1.53, 3.52, 1.12],
}
# Our balancer -> its published row (equal_alpha and mgda have none on the page).
BALANCER_ROWS = {"weighted_sum": "+ DiffusionNFT (weighted-sum)", "marble": "+ MARBLE"}
# The cost table (8xH200, K = 5): relative speed, peak GPU memory in GB.
COST = {
    "weighted_sum": (1.00, 59.0),
    "marble": (0.97, 67.0),  # amortized, N = 10
    "mgda": (0.56, 67.0),  # "without amortization": a full solve every step
}


# Section E's other tables, each with its own source line (the same page).
RHO_SOURCE = "published: MARBLE project page (aim-uofa.github.io/MARBLE), EMA decay rho ablation"
RHO_COLUMNS = TABLE1_COLUMNS[:-1]  # the eight metrics, no composite
RHO_ABLATION = {
    0.1: [0.86, 0.80, 21.52, 0.261, 0.292, 5.84, 1.22, 2.98],
    0.3: [0.88, 0.84, 21.76, 0.266, 0.312, 6.03, 1.27, 3.04],
    0.5: [0.93, 0.95, 22.02, 0.276, 0.340, 6.14, 1.48, 3.43],
    0.7: [0.94, 0.96, 22.83, 0.286, 0.355, 6.59, 1.53, 3.52],
    0.9: [0.90, 0.89, 22.14, 0.272, 0.342, 6.26, 1.47, 3.40],
}
COST_SOURCE = ("published: MARBLE project page (aim-uofa.github.io/MARBLE), training cost, "
               "8xH200, K = 5, relative to the weighted sum")
HARMONY_SOURCE = "published: MARBLE project page (aim-uofa.github.io/MARBLE), gradient harmony"
# Weighted sum -> MARBLE: share of mini-batches with an anti-aligned reward, worst-reward
# cosine min_k cos(d, g_k), across-reward variance var_k cos(d, g_k).
HARMONY = {
    "weighted_sum": {"anti_aligned_frac": 0.80, "cos_min_mean": -0.13, "cos_var_mean": 0.161},
    "marble": {"anti_aligned_frac": 0.00, "cos_min_mean": 0.37, "cos_var_mean": 0.006},
}
# The claim's question (c) compares against these: weighted sum 80%, MARBLE 0%.
PUBLISHED_ANTI_ALIGNED = {bal: v["anti_aligned_frac"] for bal, v in HARMONY.items()}


def table1() -> pd.DataFrame:
    frame = pd.DataFrame.from_dict(TABLE1, orient="index", columns=TABLE1_COLUMNS)
    frame.index.name = "model (published)"
    return frame


def load_published(path: Path) -> dict:
    """Rows {name: {run, values}}; a row named as in the paper's Table 1 without `values:`
    takes them from `marble.report.published.TABLE1`, the project's one transcription."""
    columns = [c for c, *_ in PAPER_METRICS]
    path = Path(path)
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    rows = data.get("rows")
    if not isinstance(rows, dict) or not rows:
        raise ValueError(f"{path}: no `rows:` mapping")
    for name, row in rows.items():
        if isinstance(row, dict) and "values" not in row and name in TABLE1:
            row["values"] = {c: v for c, v in zip(TABLE1_COLUMNS, TABLE1[name]) if c in columns}
        if not isinstance(row, dict) or "run" not in row or not isinstance(row.get("values"), dict):
            raise ValueError(f"{path}: row {name!r} needs `run:` and `values:` (or a Table 1 row name)")
        unknown = set(row["values"]) - set(columns)
        if unknown:
            raise ValueError(f"{path}: row {name!r}: unknown metric(s) {sorted(unknown)}; known: {columns}")
    return data
