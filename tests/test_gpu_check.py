"""`make gpu-check`'s script on the CPU (`--tiny`): the plumbing, not the figures."""

from __future__ import annotations

import json


def test_gpu_check_tiny_plumbing(tmp_path, capsys):
    from marble.tools.bench import ROWS
    from marble.tools.gpu_check import main

    out = tmp_path / "gpu_check.json"
    assert main(["--tiny", "--repeats", "1", "--work", str(tmp_path / "w"), "--out", str(out)]) == 0
    res = json.loads(capsys.readouterr().out)  # stdout is exactly the JSON
    assert json.loads(out.read_text()) == json.loads(json.dumps(res))
    assert set(res["bench"]) == {"fp16", "bf16"}
    for mp, bench in res["bench"].items():
        assert set(bench["balancers"]) == set(ROWS), mp  # every bench row, recompute included
        assert all(r["step_s"] > 0 for r in bench["balancers"].values()), mp
    steps = res["train"]["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    # rho_07's code path: a full solve at step 0, cached alpha after; fp16 GradScaler.
    assert [s["full_solve"] for s in steps] == [1.0, 0.0, 0.0]
    assert all(s["loss_scale"] == 65536.0 and s["skipped_step"] == 0.0 for s in steps)
    resume = res["resume"]
    assert resume["resumed_from"] == "checkpoint-000002" and resume["final_step"] == 3
    assert resume["bitwise_equal"] and resume["adapters_max_abs_diff_vs_straight"] == 0.0
    assert res["paper_8xH200"]["mgda"]["time"] == 0.56
