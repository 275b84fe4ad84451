"""Time limits a job meets on the cluster: the partition's MaxTime, the QOS's and the
association's MaxWall (`marble doctor`'s "slurm fits <job>" rows).

`sbatch --test-only` does not stand for them: under SLURM's default `EnforcePartLimits=NO`
it accepts a 2,880-min job on a partition whose MaxTime is 60 min, and the real job then
pends forever (reason `PartitionTimeLimit`). So the doctor reads the limits itself
(`scontrol show partition`, else `sinfo -o '%P %l'`; `sacctmgr show assoc` / `show qos`)
and these pure functions parse what those commands print and compare each job's minutes.
A limit that cannot be read is said so, never taken as "no limit".
"""

from __future__ import annotations

import re

UNLIMITED = None  # a limit of "UNLIMITED" / "infinite" / unset
_UNLIMITED_WORDS = {"unlimited", "infinite", "none", "n/a", ""}


def slurm_minutes(text: str) -> int | None:
    """Minutes of a SLURM time string (rounded up), None for no limit.

    SLURM's forms: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S` (what scontrol, sinfo
    and sacctmgr print is always `[D-]HH:MM:SS`). ValueError for anything else."""
    word = text.strip()
    if word.lower() in _UNLIMITED_WORDS:
        return UNLIMITED
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", word)
    if not match:
        raise ValueError(f"not a SLURM time: {text!r}")
    days, first, second, third = match.groups()
    if days is not None:  # D-H[:M[:S]]
        seconds = int(days) * 86400 + int(first) * 3600 + int(second or 0) * 60 + int(third or 0)
    elif third is not None:  # H:M:S
        seconds = int(first) * 3600 + int(second) * 60 + int(third)
    else:  # M[:S]
        seconds = int(first) * 60 + int(second or 0)
    return -(-seconds // 60)


def parse_partitions(scontrol_text: str) -> dict[str, dict[str, str]]:
    """{partition: its key=value fields} from `scontrol show partition [-o]` (one line or a
    block per partition: a new one starts at each `PartitionName=`)."""
    out: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for token in scontrol_text.split():
        key, eq, value = token.partition("=")
        if not eq:
            continue
        if key == "PartitionName":
            current = out.setdefault(value, {})
        elif current is not None:
            current[key] = value
    return out


def parse_sinfo_limits(sinfo_text: str) -> dict[str, dict[str, str]]:
    """The same shape from `sinfo -h -o '%P %l'` ('gpu* 1-00:00:00': `*` marks the default)."""
    out = {}
    for line in sinfo_text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            name = parts[0].rstrip("*")
            out[name] = {"MaxTime": parts[1], "Default": "YES" if parts[0].endswith("*") else "NO"}
    return out


def default_partition(partitions: dict[str, dict[str, str]]) -> str | None:
    return next((name for name, fields in partitions.items() if fields.get("Default") == "YES"), None)


def partition_qos(fields: dict[str, str]) -> str | None:
    """The partition's own QOS (`QoS=N/A` when none)."""
    qos = fields.get("QoS", "")
    return None if qos.lower() in _UNLIMITED_WORDS else qos


def parse_assoc(sacctmgr_text: str, account: str | None, partition: str | None) -> list[dict[str, str]]:
    """The user's associations that apply to a job, from `sacctmgr -nP show assoc user=U
    format=account,partition,defaultqos,qos,maxwall`: those of the job's account (any when
    none is set) and of its partition or of all partitions (an empty partition field)."""
    rows = []
    for line in sacctmgr_text.splitlines():
        fields = line.split("|")
        if len(fields) != 5:
            continue
        acct, part, default_qos, qos, maxwall = fields
        if account and acct != account:
            continue
        if part and partition and part != partition:
            continue
        rows.append(dict(account=acct, partition=part, default_qos=default_qos, qos=qos, maxwall=maxwall))
    return rows


def job_qos(assoc: dict[str, str]) -> str:
    """The QOS a job without --qos gets: the association's default QOS; without one, its only
    allowed QOS, else "normal" (slurmctld's own order)."""
    if assoc["default_qos"]:
        return assoc["default_qos"]
    allowed = [q for q in assoc["qos"].split(",") if q]
    return allowed[0] if len(allowed) == 1 else "normal"


def parse_qos_maxwall(sacctmgr_text: str) -> dict[str, str]:
    """{qos: MaxWall} from `sacctmgr -nP show qos format=name,maxwall`."""
    out = {}
    for line in sacctmgr_text.splitlines():
        fields = line.split("|")
        if len(fields) == 2 and fields[0]:
            out[fields[0]] = fields[1]
    return out


def binding_limit(runtime: int, limits: list[tuple[str, int | None]]) -> tuple[str, int] | None:
    """(where, minutes) of the shortest limit `runtime` minutes exceed, None when none."""
    over = [(where, minutes) for where, minutes in limits if minutes is not None and runtime > minutes]
    return min(over, key=lambda item: item[1]) if over else None


def time_verdict(runtime: int, limits: list[tuple[str, int | None]], unread: list[str]) -> tuple[bool | None, str]:
    """(fits: True / False / None when no limit could be read, words) for a job of `runtime`
    minutes against [(where the limit is set, its minutes or None for none)]."""
    over = binding_limit(runtime, limits)
    if over:
        return False, f"{runtime} min > {over[0]} {over[1]} min"
    if not limits:
        return None, f"time limit not read ({'; '.join(unread) or 'nothing answered'})"
    words = ", ".join(f"{where} {'unlimited' if m is None else f'{m} min'}" for where, m in limits)
    tail = f"; not read: {'; '.join(unread)}" if unread else ""
    return True, f"{runtime} min within {words}{tail}"
