"""StratifiedKRepeatSampler: per-source counts, k repeats, rank sharding, determinism, resume."""

from __future__ import annotations

from collections import Counter

import pytest

from marble.data.sampler import StratifiedKRepeatSampler, per_source_counts

# 10 geneval rows, 20 ocr rows, 70 pickscore rows, deliberately unbalanced and interleaved.
SOURCES = (["pickscore"] * 35 + ["ocr"] * 10 + ["geneval"] * 10 + ["ocr"] * 10 + ["pickscore"] * 35)


def make(rank=0, world=4, batch=6, k=4, seed=7, stratified=True):
    return StratifiedKRepeatSampler(SOURCES, k=k, batch_size=batch, world_size=world,
                                    rank=rank, seed=seed, stratified=stratified)


def test_per_source_counts_gives_remainder_to_first_sources():
    assert per_source_counts(6, 3) == [2, 2, 2]
    assert per_source_counts(4, 3) == [2, 1, 1]
    assert per_source_counts(5, 3) == [2, 2, 1]
    assert per_source_counts(2, 3) == [1, 1, 0]


def test_group_size_must_divide_the_global_batch():
    with pytest.raises(ValueError, match="not divisible by k"):
        StratifiedKRepeatSampler(SOURCES, k=5, batch_size=6, world_size=4, rank=0, seed=0)
    with pytest.raises(ValueError, match="rank 4"):
        StratifiedKRepeatSampler(SOURCES, k=4, batch_size=6, world_size=4, rank=4, seed=0)


def test_each_iteration_draws_evenly_from_sorted_sources_and_repeats_k_times():
    s = make()  # m = 4 * 6 / 4 = 6 prompts: 2 per source
    for epoch in range(50):
        plan = s.global_plan(epoch).ravel().tolist()
        counts = Counter(plan)
        assert len(counts) == 6 and set(counts.values()) == {4}
        per_source = Counter(SOURCES[i] for i in counts)
        assert per_source == {"geneval": 2, "ocr": 2, "pickscore": 2}


def test_remainder_goes_to_first_sorted_source():
    s = make(world=2, batch=8, k=4)  # m = 4 -> geneval 2, ocr 1, pickscore 1
    for epoch in range(20):
        distinct = set(s.global_plan(epoch).ravel().tolist())
        assert Counter(SOURCES[i] for i in distinct) == {"geneval": 2, "ocr": 1, "pickscore": 1}


def test_unstratified_draws_uniformly_over_rows():
    s = make(stratified=False)
    seen = Counter()
    for epoch in range(400):
        seen.update(SOURCES[i] for i in set(s.global_plan(epoch).ravel().tolist()))
    total = sum(seen.values())
    assert total == 400 * 6
    # row shares are 10% / 20% / 70%; stratified would give a third each
    assert abs(seen["geneval"] / total - 0.10) < 0.03
    assert abs(seen["pickscore"] / total - 0.70) < 0.03


def test_ranks_are_disjoint_chunks_that_cover_the_plan():
    ranks = [make(rank=r) for r in range(4)]
    for epoch in (0, 3, 11):
        for s in ranks:
            s.set_epoch(epoch)
        batches = [next(iter(s)) for s in ranks]
        assert all(len(b) == 6 for b in batches)
        assert sum(batches, []) == ranks[0].global_plan(epoch).ravel().tolist()
        # the k copies of a prompt are spread: no rank holds all of a group here
        assert Counter(sum(batches, [])) == Counter({i: 4 for i in set(sum(batches, []))})


def test_deterministic_per_seed_and_epoch():
    a, b = make(seed=1), make(seed=1)
    a.set_epoch(9)
    b.set_epoch(9)
    assert a.batch() == b.batch()
    assert a.batch(10) != a.batch(9)
    assert make(seed=2).batch(9) != a.batch(9)


def test_iterator_follows_set_epoch():
    s = make()
    it = iter(s)
    s.set_epoch(3)
    first = next(it)
    s.set_epoch(4)
    assert next(it) == s.batch(4) and first == s.batch(3)


def test_identical_sequence_after_state_restore():
    a = make(rank=2)
    a.set_epoch(17)
    state = a.state_dict()
    expected = [a.batch()] + [a.batch(e) for e in range(18, 25)]
    b = make(rank=2)
    b.load_state_dict(state)
    got = [next(iter(b))]
    for e in range(18, 25):
        b.set_epoch(e)
        got.append(next(iter(b)))
    assert got == expected
    with pytest.raises(ValueError, match="seed"):
        make(rank=2, seed=99).load_state_dict(state)


def test_too_few_rows_in_a_source_is_an_error():
    with pytest.raises(ValueError, match="only 1 rows"):
        StratifiedKRepeatSampler(["a", "a", "b"], k=1, batch_size=4, world_size=1, rank=0, seed=0)


def test_the_k_copies_of_a_prompt_spread_over_ranks_as_a_uniform_shuffle():
    """The module docstring's claim: the k copies land on different ranks (not k in a row).

    After the shuffle the plan is a uniformly random arrangement of the k copies over
    world x batch slots, so a rank holds none of a prompt's copies with probability
    C(N - B, k) / C(N, k) (N = 16 slots, B = 4 per rank, k = 4): the expected number of
    ranks a prompt reaches is W (1 - C(12, 4) / C(16, 4)) = 4 (1 - 495 / 1820) = 2.912.
    Unshuffled, every prompt would sit on one rank (1.0). 500 plans x 4 prompts: the mean's
    standard error is ~0.015, the tolerance 0.1.
    """
    s = StratifiedKRepeatSampler(SOURCES, k=4, batch_size=4, world_size=4, rank=0, seed=3)
    reached = []
    for epoch in range(500):
        plan = s.global_plan(epoch)
        for prompt in set(plan.ravel().tolist()):
            reached.append(sum(prompt in row for row in plan.tolist()))
    expected = 4 * (1 - 495 / 1820)
    assert abs(sum(reached) / len(reached) - expected) < 0.1
    # Within a rank the copies are not adjacent either: the plan is not sorted by prompt.
    assert any(list(row) != sorted(row) for row in s.global_plan(0).tolist())


def _plan_key(seed: int, epoch: int, scheme: str) -> tuple:
    s = StratifiedKRepeatSampler(SOURCES, k=4, batch_size=6, world_size=4, rank=0, seed=seed,
                                 seed_scheme=scheme)
    return tuple(s.global_plan(epoch).ravel().tolist())


def test_keyed_plans_of_seeds_0_to_15_over_epochs_0_to_9_are_pairwise_different():
    """Issue 26: under `seed + epoch` seed 43's epoch 0 is seed 42's epoch 1; keyed plans
    of 160 (seed, epoch) pairs are all distinct (the default), the reference's are not."""
    keyed = {(s, e): _plan_key(s, e, "keyed") for s in range(16) for e in range(10)}
    assert len(set(keyed.values())) == len(keyed) == 160
    assert make().seed_scheme == "keyed"  # the default
    assert _plan_key(42, 1, "reference") == _plan_key(43, 0, "reference")  # the named option
    with pytest.raises(ValueError, match="sampler_seeds"):
        StratifiedKRepeatSampler(SOURCES, k=4, batch_size=6, world_size=4, rank=0, seed=0,
                                 seed_scheme="seed_plus_epoch")
