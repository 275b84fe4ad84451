"""marble.workflow.interrupts: the process tree under Snakemake, read from /proc (the fault
itself, a real Snakemake interrupted, is tests/faults/test_snakemake_sigint.py)."""

from __future__ import annotations

from marble.workflow.interrupts import descendants, process_table


def test_descendants_walks_the_tree_children_first():
    parents = {10: 1, 11: 10, 12: 11, 13: 11, 20: 1, 14: 12}
    assert descendants(10, parents) == [11, 12, 13, 14]
    assert descendants(20, parents) == [] and descendants(99, parents) == []


def test_process_table_reads_the_parent_after_a_command_name_with_parentheses(tmp_path):
    for pid, stat in {"7": "7 (a) b) S 3 7 7 0", "8": "8 (sleep) S 7 8 8 0", "self": "x"}.items():
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "stat").write_text(stat)
    (tmp_path / "9").mkdir()  # a process gone meanwhile: no stat
    assert process_table(tmp_path) == {7: 3, 8: 7}
    assert descendants(3, process_table(tmp_path)) == [7, 8]
    assert process_table(tmp_path / "absent") == {}
