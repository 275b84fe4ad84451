"""The report's ablation table: rho runs and the exact-masking ablation (rho_07_exact)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from marble.report import tables
from marble.report.loading import RunData


def run(name: str, rho: float, exact: bool | None, lr: float = 3e-4) -> RunData:
    balancer = {"method": "marble", "alpha_ema": rho, "amortize_every": 10}
    if exact is not None:
        balancer["exact_masking"] = exact
    config = {"preset": name, "balancer": balancer, "train": {"lr": lr}}
    return RunData(name=name, path=Path(name), config=config,
                   metrics=pd.DataFrame({"step": [1.0]}))


def test_exact_masking_run_is_a_row_of_the_rho_table():
    runs = [run("rho_09", 0.9, False), run("rho_07_exact", 0.7, True), run("rho_07", 0.7, False),
            run("other_lr", 0.5, False, lr=1e-3)]
    groups = tables.rho_groups(runs)
    assert [[r.name for r in g] for g in groups] == [["rho_07", "rho_07_exact", "rho_09"]]
    evals = pd.DataFrame({"checkpoint": ["c"] * 3, "ocr": [0.5, 0.6, 0.4]},
                         index=["rho_07", "rho_07_exact", "rho_09"])
    table = tables.rho_table(groups[0], {}, evals).reset_index()
    assert list(table.columns[:3]) == ["rho", "exact_masking", "run"]
    assert table.to_dict("list") == {"rho": [0.7, 0.7, 0.9],
                                     "exact_masking": [False, True, False],
                                     "run": ["rho_07", "rho_07_exact", "rho_09"],
                                     "ocr": [0.5, 0.6, 0.4]}


def test_exact_masking_pair_alone_makes_a_table_and_rho_only_groups_keep_their_columns():
    pair = tables.rho_groups([run("rho_07", 0.7, False), run("rho_07_exact", 0.7, True)])
    assert [r.name for r in pair[0]] == ["rho_07", "rho_07_exact"]
    plain = tables.rho_groups([run("a", 0.5, None), run("b", 0.9, None)])
    evals = pd.DataFrame({"checkpoint": ["c", "c"], "ocr": [0.1, 0.2]}, index=["a", "b"])
    assert "exact_masking" not in tables.rho_table(plain[0], {}, evals).columns
