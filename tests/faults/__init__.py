"""The fault suite (issue 21): every fault a test injects, and what held.

Run it alone with `python -m tests.faults` (or `pytest tests/faults`); both print the
fault table (case / tried / held / lost) at the end. It is part of `pytest tests` too.
"""
