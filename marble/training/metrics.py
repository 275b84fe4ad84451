"""Per-step metrics: reward statistics, accumulation averages, the metrics.jsonl log.

One JSON line per optimizer step (`marble.runtime.io.append_jsonl`). NaN rewards are masked and
counted, never averaged in as zeros.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from pathlib import Path

import torch
import yaml

from marble.config_parse import load_yaml
from marble.runtime.io import append_jsonl, json_text, read_jsonl, write_text
from marble.runtime.schema import check_metrics_line
from marble.training.run_dir import TrainError
from marble.training.trackers import TrackerFanout, open_trackers


class MetricsFileError(TrainError, ValueError):
    """A line of metrics.jsonl or eval.jsonl that is not what the trainer writes (one line
    naming file, line and key). A TrainError, so `marble train` prints it and exits 2; a
    ValueError, as read_jsonl's errors were."""


def reward_stats(name: str, rewards: torch.Tensor, applicable: torch.Tensor) -> dict[str, float]:
    """`reward/<name>` (mean over scored applicable samples), counts of applicable and unscored.

    `applicable` is the mask of samples the reward applies to; an applicable sample
    whose score is not a finite number (NaN, +inf, -inf) could not be scored
    (`reward_nan/<name>` counts them all: an inf was averaged in beside `reward_nan 0`).
    """
    rewards = rewards.detach().double().cpu()
    applicable = applicable.bool().cpu()
    valid = applicable & torch.isfinite(rewards)
    mean = float(rewards[valid].mean()) if valid.any() else float("nan")
    return {
        f"reward/{name}": mean,
        f"reward_applicable/{name}": int(applicable.sum()),
        f"reward_nan/{name}": int((applicable & ~torch.isfinite(rewards)).sum()),
    }


def advantage_std(advantages: torch.Tensor) -> float:
    """Std of the valid (non-NaN) advantages of one reward; NaN when fewer than 2."""
    adv = advantages.detach().double().flatten()
    adv = adv[~torch.isnan(adv)]
    return float(adv.std()) if adv.numel() > 1 else float("nan")


def host_floats(values: list) -> list[float]:
    """`values` (device scalars, Python or numpy numbers) as floats, with one host read
    per device for all the tensors among them instead of one per value."""
    values = list(values)
    by_device: dict = defaultdict(list)
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor):
            by_device[v.device].append(i)
    for idx in by_device.values():
        read = torch.stack([values[i].detach().reshape(()).to(torch.float64)
                            for i in idx]).tolist()
        for i, x in zip(idx, read):
            values[i] = x
    return [float(v) for v in values]


class StepAverager:
    """Means of scalar metrics over the micro-steps of one optimizer step.

    Non-finite values (e.g. a cosine of a reward absent from a micro-batch) are
    skipped per key; keys in `last_keys` keep the last value instead (flags such as
    `full_solve`, alpha of the cache after the step). Values may be device scalars:
    `add` only keeps them, `result` reads them all to the host in one transfer per
    device (no sync per micro-step), then averages exactly as for Python floats.
    """

    def __init__(self, last_keys: tuple[str, ...] = ()):
        self.last_keys = set(last_keys)
        self._items: list[tuple[str, object]] = []

    def add(self, metrics: dict) -> None:
        for key, value in metrics.items():
            if isinstance(value, torch.Tensor):
                value = value.detach()
            self._items.append((key, value))

    def result(self) -> dict[str, float]:
        total: dict[str, float] = defaultdict(float)
        count: dict[str, int] = defaultdict(int)
        last: dict[str, float] = {}
        for (key, _), value in zip(self._items, host_floats([v for _, v in self._items])):
            if key in self.last_keys or key.startswith("alpha/"):
                last[key] = value
            elif math.isfinite(value):
                total[key] += value
                count[key] += 1
            else:
                count.setdefault(key, 0)
        out = {k: (total[k] / n if n else float("nan")) for k, n in count.items()}
        out.update(last)
        return out


class MetricsLog:
    """The run's metrics.jsonl: append per step; drop lines past a resumed step.

    `backends` (the run config's logging.backends): live trackers fed the same records,
    opened on the first record and only where enabled (rank 0).
    """

    def __init__(self, path: str | Path, enabled: bool = True, backends: list[str] = ("jsonl",)):
        self.path = Path(path)
        self.enabled = enabled
        self.backends = list(backends)
        self._trackers = None
        self._lines: list[str] | None = None  # what the file holds by our writes (a live run's truth)
        self._size = 0

    def log(self, record: dict) -> None:
        if self.enabled:
            self._restore_if_rolled_back()
            line = json_text(_jsonable(record))  # as append_jsonl writes it (strict: NaN -> null)
            append_jsonl(self.path, _jsonable(record))
            self._lines.append(line)
            self._size = self.path.stat().st_size
            self.trackers().log(_jsonable(record))

    # Under a live run the file only grows by our appends. Something that replaced it
    # meanwhile (`dvc checkout --force` restores the cached metrics.jsonl of an older
    # commit; an editor; a copy) is refused, not merged: the lines this run holds are
    # written back whole (atomically) before the next append, so no step is lost or
    # logged twice, and a warning names what happened.
    def _restore_if_rolled_back(self) -> None:
        if self._lines is None:  # first record of a run that was never truncated: the file is the truth
            self._lines = self._read_lines()
            self._size = self.path.stat().st_size if self.path.is_file() else 0
            return
        size = self.path.stat().st_size if self.path.is_file() else -1
        if (size == -1 and not self._lines) or (size == self._size and self._tail_matches()):
            return
        warnings.warn(f"{self.path} changed under this live run ({max(size, 0)} bytes, this run wrote "
                      f"{self._size}: restored by `dvc checkout`?); rewriting the {len(self._lines)} "
                      "lines this run holds, nothing of the other version is kept")
        write_text(self.path, "".join(x + "\n" for x in self._lines))
        self._size = self.path.stat().st_size

    def restore(self) -> bool:
        """Write back the lines this run holds when the file is gone or changed (a file
        deleted under a live run); whether it was written."""
        if not self.enabled or self._lines is None:
            return False
        size = self.path.stat().st_size if self.path.is_file() else -1
        if size == self._size and self._tail_matches():
            return False
        write_text(self.path, "".join(x + "\n" for x in self._lines))
        self._size = self.path.stat().st_size
        return True

    def _tail_matches(self) -> bool:
        if not self._lines:
            return True
        tail = (self._lines[-1] + "\n").encode("utf-8")
        with open(self.path, "rb") as fh:
            fh.seek(max(0, self._size - len(tail)))
            return fh.read() == tail

    def _read_lines(self) -> list[str]:
        if not self.path.is_file():
            return []
        lines = self.path.read_text(encoding="utf-8").splitlines()
        return [lines[lineno - 1] for lineno, _ in self._records()]

    # Typed: a resume truncates by `step` and judges the run (marble.training.outcome) from
    # these records. A step "3" compared as text (or 3.5, or true as 1), a metric "0.5" or a
    # list read as a value, or a line that is no object was taken as written; now it is an
    # error naming file, line and key, never kept or dropped. A torn *last* line is still a
    # kill mid-append (read_jsonl skips it with a warning; truncate_after cuts it off).
    def _records(self) -> list[tuple[int, dict]]:
        """(line number, record) of every line, each checked by marble.runtime.schema."""
        return [(lineno, check_metrics_line(record, f"{self.path}:{lineno}", MetricsFileError))
                for lineno, record in read_jsonl(self.path, MetricsFileError)]

    def trackers(self):
        if self._trackers is None:
            wanted = self.backends if self.enabled else []
            self._trackers = TrackerFanout(open_trackers(wanted, self.path.parent))
        return self._trackers

    def close(self) -> None:
        if self._trackers is not None:
            self._trackers.close()

    # A resume extends this record: it must be the run's own up to the checkpoint. A file
    # deleted (or restored from an older copy) resumed "fine" with only the new steps; a line
    # duplicated was kept ([1, 1, 2, 3]) and counted twice by every reader. Now a missing or
    # out-of-order step refuses the resume naming file and line (the trainer cannot rewrite
    # what it did not keep); a step logged twice with the same values (a copy, an append
    # replayed) is repaired, saying so; twice with other values is refused.
    def check_record(self, step: int, every: int | None = None) -> str | None:
        """Check (and repair duplicates of) the record up to `step`; a problem as one line, or
        None. `every`: the logging cadence (train.log_every), whose steps must all be there;
        None for a log with no fixed cadence (eval.jsonl: only unique, ordered steps)."""
        if not self.enabled or step <= 0:
            return None
        expected = set(range(every, step + 1, every)) if every else set()
        if not self.path.is_file():
            return (f"{self.path}: missing, but the run resumes from its checkpoint at step {step}: "
                    f"{len(expected)} logged steps up to it would be lost" if expected else None)
        try:
            records = self._records()
        except MetricsFileError as exc:
            return str(exc)
        first: dict[int, tuple[int, dict]] = {}
        repeats, last = [], 0
        for lineno, record in records:
            at = record["step"]
            if at > step:
                continue  # logged after the checkpoint: truncate_after drops it
            if at in first:
                if _same_values(record, first[at][1]):
                    repeats.append(lineno)
                    continue
                return (f"{self.path}:{lineno}: step {at} logged again with other values (first at "
                        f"line {first[at][0]}): two runs wrote this record")
            if at < last:
                return f"{self.path}:{lineno}: step {at} after step {last}: the record is out of order"
            first[at], last = (lineno, record), at
        missing = sorted(expected - set(first))
        if missing:
            where = next((n for n, r in records if r["step"] > missing[0]), len(records) + 1)
            return (f"{self.path}:{where}: step {missing[0]} missing ({len(missing)} of the {len(expected)} "
                    f"steps up to the checkpoint at step {step}): the file was cut, replaced or deleted")
        if repeats:
            self._drop_lines(set(repeats))
            warnings.warn(f"{self.path}: lines {', '.join(map(str, repeats))} repeated a logged step "
                          "with the same values; removed (the record keeps each step once)")
        return None

    def _drop_lines(self, linenos: set[int]) -> None:
        lines = self.path.read_text(encoding="utf-8").splitlines()
        write_text(self.path, "".join(x + "\n" for n, x in enumerate(lines, 1) if n not in linenos))

    def truncate_after(self, step: int) -> int:
        """Remove records with `step` > the resumed step (logged after the last checkpoint).

        Rewritten atomically; returns how many lines were dropped, a torn last line
        (a kill mid-write) included. A bad line elsewhere is an error naming it.
        """
        if not self.enabled or not self.path.is_file():
            self._lines, self._size = [], 0
            return 0
        lines = self.path.read_text(encoding="utf-8").splitlines()
        kept = [lines[lineno - 1] for lineno, rec in self._records() if rec["step"] <= step]
        dropped = sum(1 for line in lines if line.strip()) - len(kept)
        if dropped:
            write_text(self.path, "".join(x + "\n" for x in kept))
        self._lines, self._size = kept, self.path.stat().st_size
        return dropped

    def read(self) -> list[dict]:
        if not self.path.is_file():
            return []
        return [record for _, record in self._records()]


def logged_cadence(run_dir: str | Path, default: int) -> int:
    """The logging cadence a run's record was written with (what check_record expects):
    train.log_every may change on resume, and the run folder's config.yaml holds the last
    attempt's until this attempt's first checkpoint rewrites it; `default` without one."""
    try:
        saved = load_yaml((Path(run_dir) / "config.yaml").read_text(encoding="utf-8"))
        default = int(saved["train"]["log_every"])
    except (OSError, ValueError, TypeError, KeyError, yaml.YAMLError):
        pass
    return max(1, int(default))


def _same_values(a: dict, b: dict) -> bool:
    """One step logged twice alike: equal but for wall-clock timings (NaN equal to NaN)."""
    keys = {k for k in (*a, *b) if not k.startswith("time/")}
    return all(a.get(k) == b.get(k) or (a.get(k) != a.get(k) and b.get(k) != b.get(k)) for k in keys)


def _jsonable(record: dict) -> dict:
    out = {}
    for key, value in record.items():
        if isinstance(value, torch.Tensor):
            value = value.item() if value.numel() == 1 else value.tolist()
        elif isinstance(value, bool):
            value = bool(value)
        out[key] = value
    return out
