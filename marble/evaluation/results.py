"""The results file, averages and run identity of `marble evaluate` (pure functions).

`evaluation_results.jsonl` holds one line per finished sample and is appended per batch,
so a crash loses at most the batch in flight; on read the last line of a sample wins.
Scores are floats, `null` where the value is NaN (not applicable, or unscorable), with
`not_applicable` naming the rewards whose content rule excluded the sample, and `failed`
naming those whose (remote) request failed: missing, not scored, so the next run retries them.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Iterable

from marble.evaluation.datasets import GENEVAL  # the dataset, and the reward scoring it, by one name
from marble.rewards.geneval_rules import TAGS as GENEVAL_TAGS  # the one definition of the six tags
from marble.rewards.geneval_rules import per_tag_means
from marble.runtime.io import read_jsonl
from marble.runtime.schema import check_result_row

GENEVAL_DETAIL_KEYS = ("accuracy", "strict_accuracy")
# The results file of an evaluation folder (marble.evaluation.runner writes it; summary reads it).
RESULTS_FILE = "evaluation_results.jsonl"
# Arguments that change the images; a resume with any of them changed would mix two runs.
IDENTITY_KEYS = (
    "dataset", "model_path", "checkpoint", "lora_hf_path", "num_inference_steps",
    "guidance_scale", "resolution", "seed", "mixed_precision", "model_type",
)


class ResultsError(ValueError):
    """A results or run_info file that cannot be used; the message names the file."""


def finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def json_scores(scores: dict[str, float]) -> dict[str, float | None]:
    """NaN/inf -> None so the jsonl stays strict JSON."""
    return {k: (float(v) if finite(v) else None) for k, v in scores.items()}


def json_safe(values: dict) -> dict:
    """A flat dict with NaN/inf floats replaced by None (strict JSON)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in values.items()}


def read_results(path: str | Path) -> dict[int, dict]:
    """sample_id -> row; a torn final line (crash mid-write) is ignored.

    A rescored sample (more rewards, a retried request) is appended again with `rev` one
    higher, and that line wins. Anything else is an edit or a copy, an error naming the
    file and line: a sample repeated without the next `rev`, a score that is not a finite
    number or null (NaN, "NaN" and Infinity were counted as scored: an unscorable sample is
    stored as null, and counted as such).
    """
    path = Path(path)
    if not path.is_file():
        return {}
    rows: dict[int, dict] = {}
    for lineno, row in read_jsonl(path, ResultsError):
        if not isinstance(row, dict) or not isinstance(row.get("sample_id"), int) \
                or isinstance(row.get("sample_id"), bool):
            raise ResultsError(f"{path}:{lineno}: a result row needs an integer sample_id")
        check_row(path, lineno, row, rows.get(row["sample_id"]))
        rows[row["sample_id"]] = row
    return dict(sorted(rows.items()))


def check_row(path: Path, lineno: int, row: dict, previous: dict | None) -> None:
    """ResultsError unless `row` is a valid first line or the next revision of its sample."""
    sid = row["sample_id"]
    scores = row.get("scores") or {}
    if not isinstance(scores, dict):
        raise ResultsError(f"{path}:{lineno}: sample {sid}: `scores` must be a mapping")
    for name, value in scores.items():
        if value is not None and not finite(value):
            raise ResultsError(f"{path}:{lineno}: sample {sid}: score {name!r} = {value!r} is not a finite "
                               "number (unscorable samples are stored as null); the file was edited")
    check_result_row(row, f"{path}:{lineno}: sample {sid}", ResultsError)
    meta = row.get("metadata") or {}
    if meta.get("source") == GENEVAL and meta.get("tag") not in GENEVAL_TAGS:  # dropped from every per-tag mean
        raise ResultsError(f"{path}:{lineno}: sample {sid}: `metadata.tag` = {meta.get('tag')!r} is not a GenEval "
                           f"tag ({', '.join(sorted(GENEVAL_TAGS))}); the file was edited")
    legacy = previous is not None and "rev" not in previous and "rev" not in row  # files of before revisions
    want = 1 if previous is None else previous.get("rev", 1) + 1
    if not legacy and row.get("rev", 1) != want:
        raise ResultsError(f"{path}:{lineno}: sample {sid} appears again as revision {row.get('rev', 1)}, "
                           f"expected {want}: a duplicated or edited line; remove it or rerun into a new --output_dir")


def same_prompt(row: dict | None, prompt_id: str, prompt: str) -> bool:
    """The row was made for this prompt: its content key (prompt_id, a hash of source, text and
    metadata) and text. Rows are keyed by sample_id, a position in the prompt file: a prompt
    edited in place, or another --data_dir, keeps the ids, so a row of the old prompt must not
    stand for the new one (it is regenerated, and never averaged in)."""
    return row is not None and row.get("prompt_id") == prompt_id and row.get("prompt") == prompt


def current_rows(rows: dict[int, dict], samples) -> list[dict]:
    """The rows of `samples` (EvalSample-like) made for their current prompts, in sample order."""
    return [rows[s.sample_id] for s in samples if same_prompt(rows.get(s.sample_id), s.prompt_id, s.prompt)]


def prompt_set_digest(samples) -> str:
    """sha256 of the evaluated prompts' content keys in order: what run_info.json records."""
    text = "\n".join(f"{s.sample_id}\t{s.prompt_id}" for s in samples)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def is_scored(row: dict, rewards: Iterable[str]) -> bool:
    """The row has a value (number or an explicit null) for every requested reward, and
    none of them is a failed request (those are missing: a rerun scores them again)."""
    scores, failed = row.get("scores") or {}, set(row.get("failed") or [])
    return all(name in scores and name not in failed for name in rewards)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def reward_average(rows: list[dict], name: str) -> dict[str, float | int]:
    """Mean over finite values; n_ = finite count, nan_ = applicable but unscorable,
    failed_ = of those, failed requests (retried by the next run)."""
    values, nan, not_applicable, failed = [], 0, 0, 0
    for row in rows:
        value = (row.get("scores") or {}).get(name)
        failed += name in (row.get("failed") or [])
        if finite(value):
            values.append(float(value))
        elif name in (row.get("not_applicable") or []):
            not_applicable += 1
        elif name in (row.get("scores") or {}):
            nan += 1
    return {name: _mean(values), f"n_{name}": len(values), f"nan_{name}": nan,
            f"na_{name}": not_applicable, f"failed_{name}": failed}


def geneval_summary(rows: list[dict]) -> dict[str, float]:
    """Per-tag accuracies and the official overall (mean of the six per-tag accuracies).

    The reference's `average_scores.json` averages over samples instead; both are kept
    (`accuracy` is the sample mean, `geneval_overall` the official number, docs/algorithm.md §10).
    """
    out: dict[str, float] = {}
    for key in GENEVAL_DETAIL_KEYS:
        values = [float(r["scores"][key]) for r in rows if finite((r.get("scores") or {}).get(key))]
        if values:
            out[key] = _mean(values)
    details = [{**(r.get("scores") or {}), "tag": (r.get("metadata") or {}).get("tag")} for r in rows]
    means = {key: per_tag_means(details, key) for key in GENEVAL_DETAIL_KEYS}
    for tag in GENEVAL_TAGS:  # the summary's key order: tag by tag
        for key in GENEVAL_DETAIL_KEYS:
            if tag in means[key]:
                out[f"{tag}_{key}"] = means[key][tag]
    # The reference's per-tag means of the partial-credit score, beside the per-tag accuracies.
    credit = per_tag_means([{"score": (r.get("scores") or {}).get(GENEVAL), "tag": d["tag"]}
                            for r, d in zip(rows, details)], "score")
    out.update({f"{tag}_partial_credit": credit[tag] for tag in GENEVAL_TAGS if tag in credit})
    tag_acc = [means["accuracy"][tag] for tag in GENEVAL_TAGS if tag in means["accuracy"]]
    # The official overall needs every tag; a --limit subset leaves it undefined (NaN).
    out["geneval_overall"] = _mean(tag_acc) if len(tag_acc) == len(GENEVAL_TAGS) else float("nan")
    out["geneval_tags_present"] = len(tag_acc)
    return out


def average_scores(rows: list[dict], rewards: list[str]) -> dict[str, float | int]:
    """`average_scores.json`: per-reward means and counts (+ GenEval detail when present)."""
    out: dict[str, float | int] = {"num_samples": len(rows)}
    for name in rewards:
        out.update(reward_average(rows, name))
    if any(key in (r.get("scores") or {}) for r in rows for key in GENEVAL_DETAIL_KEYS):
        out.update(geneval_summary(rows))
    return out


def identity(args: dict) -> dict:
    return {key: args.get(key) for key in IDENTITY_KEYS}


def _content(value):
    """An identity value as compared: an input entry without its path (marble.evaluation.identity)."""
    return {k: v for k, v in value.items() if k != "path"} if isinstance(value, dict) else value


def same_value(old, new) -> bool:
    """Equal identity values; inputs ({path, fingerprint} or {ref}) compare by content, so a
    moved project is the same run. A string from a run_info of before fingerprints matches an
    entry whose reference or resolved path it spells."""
    if isinstance(old, str) and isinstance(new, dict):
        return old in (new.get("ref"), str(Path(new.get("path", "")).resolve()) if new.get("path") else None)
    return _content(old) == _content(new)


def _shown(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return repr(value)


def check_results_have_identity(info_path: Path) -> None:
    """Results without their run_info.json (deleted, or a partial restore) say nothing of the
    base, LoRA and prompts they were scored with: rebuilt, never adopted (run_info.json is
    written before the first row, so a folder with rows and without it lost it)."""
    if (info_path.parent / RESULTS_FILE).is_file():
        raise ResultsError(
            f"{info_path.parent} holds {RESULTS_FILE} but no {info_path.name}, which says what they were "
            "scored with: restore it, or move the folder aside and rerun this `marble evaluate` command to "
            "rebuild them")


def check_not_legacy(info_path: Path, old: dict, new_identity: dict) -> None:
    """Refuse results of a marble from before content identities: their run_info names the base
    model and the LoRA by path, which said nothing of what the path held when they were scored
    (a base replaced since reported the old score as current). Rebuilt, never adopted."""
    legacy = [k for k in ("model_path", "checkpoint")
              if isinstance(old.get(k), str) and isinstance(new_identity.get(k), dict)]
    if legacy:
        shown = ", ".join(f"{k} {old[k]!r}" for k in legacy)
        raise ResultsError(
            f"{info_path.parent} holds results of an earlier marble, whose identity named {shown} by path, "
            "not by content: they may be of another base or LoRA than the path holds now. Move the folder "
            "aside and rerun this `marble evaluate` command to rebuild them, or use another --output_dir")


def check_same_run(info_path: str | Path, new_identity: dict) -> None:
    """Refuse to append to results made with other image-changing arguments."""
    info_path = Path(info_path)
    if not info_path.is_file():
        check_results_have_identity(info_path)
        return
    try:
        old = json.loads(info_path.read_text(encoding="utf-8")).get("identity", {})
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{info_path}: invalid JSON: {exc}") from exc
    check_not_legacy(info_path, old, new_identity)
    diffs = [f"{k}: {_shown(old.get(k))} -> {_shown(new_identity.get(k))}"
             for k in IDENTITY_KEYS if not same_value(old.get(k), new_identity.get(k))]
    if diffs:
        raise ResultsError(
            f"{info_path.parent} holds results of a different run ({'; '.join(diffs)}); "
            "use another --output_dir or delete the old results"
        )
