"""Tests at the edges (issue 50 item 4): each mechanism below let a catalogued mutant
(marble/tools/mutants_catalogue.py) survive its module's own tests. Each test states the
mechanism's rule and checks it on the input that tells the right rule from the mutated one.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from scipy import optimize, stats

# ------------------------------------------------------------------ TOST and its family


def test_tost_is_the_larger_one_sided_p_on_a_sample_off_zero():
    """TOST's p is the LARGER of the two one-sided p (both nulls must be rejected). With mean
    0 both are equal, so the sample sits near the upper margin: the two differ by orders of
    magnitude, and each is scipy's own one-sided t-test."""
    from marble.experiments.claim_family import tost

    values, margin = [0.7, 0.9, 0.8, 1.0, 0.85], 1.0
    p_low = stats.ttest_1samp(values, -margin, alternative="greater").pvalue  # H0: mean <= -margin
    p_high = stats.ttest_1samp(values, margin, alternative="less").pvalue  # H0: mean >= +margin
    assert p_low < 1e-5 < 0.01 < p_high  # the two really differ here
    assert tost(values, margin) == pytest.approx(p_high, rel=1e-9)
    assert tost([-v for v in values], margin) == pytest.approx(p_high, rel=1e-9)  # mirrored


def test_equivalence_is_decided_on_the_holm_adjusted_tost_p():
    """Two specialists, each TOST p 0.030 (< 0.05 alone), Holm-adjusted 0.060: neither is
    claimed equivalent; the unadjusted p would claim both."""
    from marble.experiments.claim_design import multiplicity
    from marble.report.run_measures import RunMeasure

    diffs = [0.05, 0.15, 0.1, 0.2]  # marble minus baseline per seed, mean 0.125 (not 0)
    measures = []
    for seed, d in enumerate(diffs, start=1):
        base = {"s1": 0.1 * seed, "s2": 0.2 * seed}
        measures.append(RunMeasure("b", seed, base, {}, {}, math.nan, 0, 0))
        measures.append(RunMeasure("m", seed, {r: v + d for r, v in base.items()}, {}, {}, math.nan, 0, 0))
    out = multiplicity(measures, ["s1", "s2"], {"s1": 1.0, "s2": 1.0}, "m", "b",
                       fixed_effects={"s1": 0.22, "s2": 0.22})["b_equivalence"]
    for s in ("s1", "s2"):
        assert 0.025 < out[s]["p_tost"] < 0.05 <= out[s]["p_holm"]
        assert out[s]["equivalent"] is False


# ------------------------------------------------------------------ the min-norm QP beyond enumeration


def _reference_min_norm(g: np.ndarray) -> float:
    """The simplex QP's optimum by SLSQP from several starts (an independent solver)."""
    k, best = len(g), math.inf
    for start in [np.full(k, 1.0 / k)] + [np.eye(k)[i] for i in range(0, k, 3)]:
        res = optimize.minimize(lambda a: a @ g @ a, start, jac=lambda a: 2 * g @ a, method="SLSQP",
                                bounds=[(0.0, 1.0)] * k, options={"ftol": 1e-15, "maxiter": 1000},
                                constraints=[{"type": "eq", "fun": lambda a: a.sum() - 1.0}])
        best = min(best, float(res.x @ g @ res.x))
    return best


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("dim", [6, 40])  # rank-deficient (many optima's supports) and full rank
def test_min_norm_beyond_enumeration_is_optimal_on_random_k14_grams(seed, dim):
    """K = 14 > ENUM_MAX_K takes the Frank-Wolfe path: its alpha must be on the simplex, at
    least as good as an independent solver's, and certify its own optimality (the duality
    gap a'Ga - min_i (Ga)_i, zero exactly at the optimum)."""
    from marble.maths.qp import ENUM_MAX_K, min_norm_weights

    k = 14
    assert k > ENUM_MAX_K
    rng = np.random.default_rng(seed)
    v = rng.normal(size=(k, dim)) + rng.normal(size=dim)  # correlated, as rewards' gradients are
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    g = v @ v.T
    alpha = min_norm_weights(g)
    assert alpha.min() >= 0 and alpha.sum() == pytest.approx(1.0, abs=1e-12)
    obj = float(alpha @ g @ alpha)
    assert obj <= _reference_min_norm(g) + 1e-10
    assert obj - float((g @ alpha).min()) <= 1e-9 * max(obj, 1e-12)


# ------------------------------------------------------------------ fingerprints and the hash cache


def test_a_tree_fingerprint_names_its_files(tmp_path):
    """A folder's identity covers its file names: a rename, or two files' contents swapped,
    is another tree."""
    from marble.runtime.fingerprint import HashCache, fingerprint

    cache = HashCache(tmp_path / "cache.json")
    tree = tmp_path / "model"
    tree.mkdir()
    (tree / "a.bin").write_bytes(b"weights")
    (tree / "b.json").write_bytes(b"{}")
    before = fingerprint(tree, cache)
    (tree / "b.json").rename(tree / "c.json")
    assert fingerprint(tree, cache) != before
    (tree / "c.json").rename(tree / "b.json")
    assert fingerprint(tree, cache) == before
    (tree / "a.bin").write_bytes(b"{}")
    (tree / "b.json").write_bytes(b"weights")
    assert fingerprint(tree, cache) != before


def test_the_hash_cache_is_not_keyed_on_size_alone(tmp_path):
    """A same-size rewrite, its old mtime put back (what `touch -d` does), is hashed again."""
    from marble.runtime.fingerprint import HashCache

    cache = HashCache(tmp_path / "cache.json")
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"A" * 4096)
    first = cache.sha256(path)
    st = path.stat()
    path.write_bytes(b"B" * 4096)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cache.sha256(path) != first
    assert HashCache(tmp_path / "cache.json").sha256(path) == cache.sha256(path)  # and it is saved


# ------------------------------------------------------------------ typed reads


def test_a_json_true_is_no_number(tmp_path):
    """JSON true is a bool, and Python's bool is an int: the one number check refuses it, so
    an average_scores.json holding `true` is an edit, not a score of 1."""
    from marble.evaluation.summary import collect
    from marble.runtime.schema import is_number

    assert [is_number(x) for x in (True, False, 1, 0.5, "1", None)] == [False, False, True, True, False, False]
    folder = tmp_path / "evals" / "run" / "checkpoint-1" / "tiny"
    folder.mkdir(parents=True)
    (folder / "average_scores.json").write_text(json.dumps({"pickscore": True}))
    with pytest.raises(ValueError, match="is not a number or null"):
        collect(tmp_path / "evals")


def test_the_legacy_row_rule_needs_both_lines_without_a_revision(tmp_path):
    """Only files from before revisions (neither line has `rev`) may repeat a sample without
    the next revision; a line with `rev` beside one without is an edit."""
    from marble.evaluation.results import ResultsError, read_results

    def rows(*lines):
        path = tmp_path / "evaluation_results.jsonl"
        path.write_text("".join(json.dumps({"sample_id": 0, "scores": {"a": float(i)}, **extra}) + "\n"
                                for i, extra in enumerate(lines)))
        return read_results(path)

    assert rows({}, {})[0]["scores"] == {"a": 1.0}  # legacy: the last line wins
    assert rows({}, {"rev": 2})[0]["rev"] == 2  # a legacy line counts as revision 1
    for lines in (({"rev": 1}, {}), ({}, {"rev": 7})):
        with pytest.raises(ResultsError, match="appears again as revision"):
            rows(*lines)


# ------------------------------------------------------------------ the output-space rescale


def test_the_output_space_rescale_uses_the_valid_rewards_norms_only():
    """w_k = alpha_k n_mean / |u_k|, n_mean over the VALID rewards: a reward with no gradient
    (norm 0) must not pull the mean down. Orthogonal u of norms 2, 1, 0: alpha = (1/2, 1/2, 0),
    n_mean = 1.5, w = (0.375, 0.75, 0)."""
    from marble.maths.fresh_balance import gram_weights

    w, alpha, valid, _, _ = gram_weights(np.diag([4.0, 1.0, 0.0]), 1e-12, "unit")
    assert valid.tolist() == [True, True, False]
    np.testing.assert_allclose(alpha, [0.5, 0.5, 0.0], atol=1e-12)
    np.testing.assert_allclose(w, [0.375, 0.75, 0.0], atol=1e-12)


# ------------------------------------------------------------------ Table 1 and the config


def test_table1_columns_are_the_papers_order():
    """Table 1's metric columns, left to right as the paper prints them (the descriptors'
    `column.position`), whatever order the rewards are registered in."""
    from marble.report.table1 import build, columns

    published = {"rows": {"ours": {"run": "r", "values": {}}}}
    assert columns(build({"r": {}}, published)) == [
        "GenEval", "OCR", "PickScore", "CLIPScore", "HPSv2.1", "Aesthetic", "ImgRwd", "UniRwd", "Composite"]


def test_a_reward_named_twice_is_refused():
    from marble.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="names a reward twice"):
        load_config("tiny", overrides=['rewards=[{"name": "toy_brightness"}, {"name": "toy_brightness"}]'])
