"""marble.workflow.interrupts: the process tree under Snakemake, read from /proc (the fault
itself, a real Snakemake interrupted, is tests/faults/test_snakemake_sigint.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from marble.workflow.interrupts import descendants, process_table


def printed_by(script: str) -> dict[str, str]:
    """Run `script` in a fresh Python (its signal handlers are its own) and read the
    `key=value` lines it prints."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return dict(line.split("=", 1) for line in out.stdout.splitlines())


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


def test_the_first_interrupt_is_forwarded_then_snakemakes_handler_gets_it_outside_our_frame():
    """A child gets SIGINT; the previous handler runs once, from the interrupted code (no frame
    of marble's in its traceback), and is the handler from then on."""
    lines = printed_by("""
        import signal, subprocess, sys, time, traceback
        from marble.workflow.interrupts import forward_interrupt_to_jobs
        seen = []
        def snakemakes(signum, frame):
            seen.append([f.name for f in traceback.extract_stack(frame)])
            raise KeyboardInterrupt
        signal.signal(signal.SIGINT, snakemakes)
        assert forward_interrupt_to_jobs()
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        time.sleep(0.5)
        try:
            signal.raise_signal(signal.SIGINT)
            for _ in range(100):
                time.sleep(0.01)
        except KeyboardInterrupt as exc:
            frames = [f.name for f in traceback.extract_tb(exc.__traceback__)]
            print("frames=" + repr(frames))
        print(f"child={child.wait(timeout=30)}")
        print(f"handler_is_snakemakes={signal.getsignal(signal.SIGINT) is snakemakes}")
        print(f"calls={len(seen)}")
    """)
    assert lines["child"] == str(-signal.SIGINT)  # forwarded: the sleeping child died of it
    assert lines["handler_is_snakemakes"] == "True" and lines["calls"] == "1"
    assert "on_interrupt" not in lines["frames"], lines["frames"]


def test_a_signal_held_in_the_block_is_sent_again_after_it_outside_our_frame():
    """Inside `signals_held` a SIGINT is only noted (the block runs to its end); after it the
    handler is back and gets the signal once, from the code then running."""
    lines = printed_by("""
        import signal, time, traceback
        from marble.workflow.interrupts import signals_held
        # Python's own handler, as in a terminal: a child of a shell's background job starts
        # with SIGINT ignored, and signals_held leaves an ignored signal alone
        signal.signal(signal.SIGINT, signal.default_int_handler)
        steps = []
        try:
            with signals_held():
                signal.raise_signal(signal.SIGINT)
                for _ in range(20):
                    time.sleep(0.01)
                steps.append("block ended")
            steps.append("after the block")
            for _ in range(100):
                time.sleep(0.01)
        except KeyboardInterrupt as exc:
            frames = [f.name for f in traceback.extract_tb(exc.__traceback__)]
            print("frames=" + repr(frames))
        print(f"steps={steps}")
        print(f"handler_back={signal.getsignal(signal.SIGINT) is signal.default_int_handler}")
    """)
    assert lines["steps"] == "['block ended', 'after the block']"
    assert lines["handler_back"] == "True"
    assert "frames" in lines and "signals_held" not in lines["frames"], lines
