"""`marble doctor`'s SLURM rows: partitions, GPU type, whether each job shape fits, account.

Asked of the cluster itself (sinfo, `sbatch --test-only` with each job's own options,
sacctmgr); with no controller answering, a warning, never "ok". Split from marble.doctor
(which builds the whole table) so each file stays one concern under the house size limit.
"""

from __future__ import annotations

import os
import shutil

from marble.workflow import doctor_checks as checks
from marble.workflow import slurm_capacity as capacity
from marble.workflow import slurm_eval
from marble.workflow import slurm_limits as limits
from marble.workflow.doctor_checks import FAIL, OK, SKIP, WARN, Check

__all__ = ["LOCAL_JOBS_ENV", "local_rows", "slurm_rows", "capacity_rows", "account_row", "TimeLimits"]

LOCAL_JOBS_ENV = "MARBLE_LOCAL_JOBS"


def local_rows() -> list[Check]:
    return [Check("slurm", SKIP, f"jobs run on this machine (--local-jobs / {LOCAL_JOBS_ENV}=1): nothing is submitted")]


def slurm_rows(config: dict, root=".", targets=()) -> list[Check]:
    cluster = config.get("cluster") or {}
    if not shutil.which("sinfo"):
        image = os.environ.get("APPTAINER_CONTAINER") or os.environ.get("SINGULARITY_CONTAINER")
        if image:
            # In the image (--sdm apptainer) no client does not mean no cluster: the jobs go to
            # SLURM, and a training job's `srun` would be missing there too.
            return [Check("slurm", WARN, f"no SLURM client inside the container {image}: cluster: not "
                          "checked, and training jobs would stop at launch (no srun)",
                          "bind the site's SLURM client into the image (apptainer-args; docs/container.md)")]
        return [Check("slurm", SKIP, "no sinfo here: cluster: not checked")]
    ping = checks.run_probe(["scontrol", "ping"])
    if ping is None or ping.returncode != 0 or "UP" not in ping.stdout:
        # Not "ok": nothing about partitions, capacity or accounts is known.
        detail = (ping.stdout or ping.stderr).strip().splitlines()[:1] if ping else ["no scontrol"]
        return [Check("slurm controller", WARN, f"no controller answers ({' '.join(detail)}): "
                      "partitions, job shapes and account not checked",
                      "run the doctor where `scontrol ping` says UP (the login node)")]
    rows = []
    for key in ("partition", "gpu_partition"):
        part = cluster.get(key)
        if part:
            found = checks.run_out(["sinfo", "-h", "-p", part, "-o", "%P %G"])
            rows.append(Check(f"slurm {key}", OK if found else FAIL, f"{part}: {found or 'unknown'}",
                              "" if found else f"`sinfo -s` lists the partitions; set cluster.{key}"))
    gpu_type, gpu_part = cluster.get("gpu_type"), cluster.get("gpu_partition") or cluster.get("partition")
    if gpu_type and checks.wants_gpu(config):
        gres = checks.run_out(["sinfo", "-h", *(["-p", gpu_part] if gpu_part else []), "-o", "%G"])
        ok = f"gpu:{gpu_type}" in gres
        rows.append(Check("slurm gres", OK if ok else FAIL, f"gpu:{gpu_type} in {gres.split() or 'nothing'}",
                          "" if ok else "set cluster.gpu_type to a type `sinfo -o %G` shows"))
    rows.extend(capacity_rows(config, root, targets))
    rows.append(account_row(cluster.get("account")))
    return rows


def capacity_rows(config: dict, root=".", targets=()) -> list[Check]:
    """Every job shape `targets` submit (slurm_capacity.submitted_jobs), asked of SLURM with
    `sbatch --test-only`, and its minutes against the time limits it would meet (which
    --test-only does not check); a training attempt also against the plan's step time."""
    rows = []
    time_limits = TimeLimits(config["cluster"].get("account"))
    shapes = capacity.job_shapes(config, targets)
    # Only when training is submitted: the plan's step time costs a FLOP count per run.
    step = capacity.plan_step_s(config, root) if "train_run" in shapes else None
    for name, res in shapes.items():
        if name == "evaluate_ckpt":  # each evaluation asks its own minutes (slurm_eval)
            jobs = slurm_eval.planned_jobs(config, root, "train_run" in shapes)
            res = {**res, "runtime": max([res["runtime"], *(m for _, _, m in jobs)])}
        proc = checks.run_probe(capacity.test_only_args(res))
        if proc is None:
            fits, words = None, "sbatch --test-only did not answer"
        else:
            fits, words = capacity.test_only_verdict(proc.returncode, proc.stderr + proc.stdout)
        found, unread = time_limits.of(res.get("slurm_partition"))
        in_time, time_words = limits.time_verdict(res["runtime"], found, unread)
        if name == "evaluate_ckpt":
            rows.extend(eval_rows(jobs, res, found, unread, fits, words))
            continue
        fix = []
        if name == "train_run":  # an attempt too short for a step requeues for ever (issue 48)
            in_time, time_words, fix = _train_attempt(config["train"], step, found, in_time, time_words)
        if fits is False:
            fix.append(f"`sinfo -p <partition> -o '%D %c %m %G %l'` shows what a partition holds; shrink the "
                       f"job ({capacity.SHAPE_KEYS[name]}) or use a partition that holds it (cluster.gpu_partition)")
        if in_time is False and not fix:
            fix.append(time_fix(name, limits.binding_limit(res["runtime"], found)[1]))
        status = FAIL if False in (fits, in_time) else (WARN if None in (fits, in_time) else OK)
        rows.append(Check(f"slurm fits {name}", status, f"{capacity.describe(res)}: {words}; {time_words}",
                          "; ".join(fix)))
    return rows


def eval_rows(jobs, res: dict, found, unread, fits, words) -> list[Check]:
    """One row for the evaluations' shape, and one FAIL row per evaluation whose planned
    minutes (its --time, slurm_eval.job_minutes) a partition / QOS limit would cut short."""
    over = []
    for job, hours, minutes in jobs:
        in_time, time_words = limits.time_verdict(minutes, found, unread)
        if in_time is False:
            over.append(Check(f"slurm fits evaluate_ckpt {job}", FAIL,
                              f"{'not planned' if hours is None else f'planned {hours:.2f} h'} -> --time "
                              f"{minutes} min: {time_words}", _eval_fix(hours, found)))
    in_time, tail = limits.time_verdict(res["runtime"], found, unread)
    if over:
        in_time, tail = False, f"{len(over)} over their limit (rows below)"
    status = FAIL if False in (fits, in_time) else (WARN if None in (fits, in_time) else OK)
    minutes = [m for _, _, m in jobs] or [res["runtime"]]
    detail = (f"{len(jobs)} job(s), --time {min(minutes)}-{max(minutes)} min (the plan x{slurm_eval.EVAL_MARGIN} + "
              f"{slurm_eval.EVAL_LOAD_MIN} min, at least eval.resources.runtime); {capacity.describe(res)}: "
              f"{words}; {tail}")
    fix = ("" if fits is not False else "`sinfo -p <partition> -o '%D %c %m %G %l'` shows what a partition holds; "
           "shrink eval.resources or use a partition that holds it")
    return [Check("slurm fits evaluate_ckpt", status, detail, fix), *over]


def _eval_fix(hours: float | None, found) -> str:
    """Lower the floor when the plan's own minutes fit the limit; else a longer limit or fewer samples."""
    limit = limits.binding_limit(10**9, found)[1]
    if hours is not None and slurm_eval.job_minutes(0, hours) <= limit:
        return (f"set eval.resources.runtime to at most {limit} min (it is each job's minimum; this one is "
                f"planned at {slurm_eval.job_minutes(0, hours)} min)")
    return ("use a partition / QOS that allows it (cluster.gpu_partition), or evaluate fewer samples "
            "(eval.limit / eval.protocols.<row>.limit)")


def _train_attempt(train: dict, step, found, in_time, time_words) -> tuple:
    """(fits, words, fix) of the training row with its attempt compared with one step of the
    plan after the signal lead; a fix only ever names a runtime that fits the limits AND steps."""
    signal_s = train["requeue_signal_s"]
    fits, words = capacity.step_fit(train["runtime"], signal_s, step)
    words = f"{time_words}; {words}"
    if fits is not False and in_time is not False:
        return in_time, words, []
    need = capacity.min_train_runtime(signal_s, step[0] if step else 0.0)
    cap = limits.binding_limit(10**9, found)  # the shortest finite limit the job meets
    if cap and cap[1] < need:
        fix = (f"no train.runtime fits: {cap[0]} {cap[1]} min < {need} min (one step after the "
               f"{signal_s} s lead); lower train.requeue_signal_s or use a partition / QOS with longer jobs")
    elif in_time is False:
        fix = time_fix("train_run", limits.binding_limit(train["runtime"], found)[1])
    else:
        fix = (f"set train.runtime to at least {need} min{f' and at most {cap[1]}' if cap else ''} "
               f"(one step after the {signal_s} s signal lead)")
    return False, words, [fix]


def time_fix(name: str, limit: int) -> str:
    key = capacity.RUNTIME_KEYS[name]
    if name == "train_run":
        # A training longer than the limit still runs: it checkpoints at the limit and
        # requeues itself (--signal=USR1 + scontrol requeue), as often as it needs.
        return (f"set {key}: {limit} (or less): the training then checkpoints before each limit and requeues "
                "itself until done (docs/cluster.md, 'Time limits'); or use a partition / QOS that allows it")
    return f"set {key} to at most {limit} min, or use a partition / QOS that allows the job"


class TimeLimits:
    """The time limits a job meets, read once per doctor run: partitions from `scontrol show
    partition` (else `sinfo`), the user's associations and QOS from `sacctmgr` (needs slurmdbd)."""

    def __init__(self, account: str | None):
        self.account = account
        self.partitions, self.partition_source = self._partitions()
        user = capacity.slurm_user()
        assoc = checks.run_probe(["sacctmgr", "-nP", "show", "assoc", f"user={user}",
                                  "format=account,partition,defaultqos,qos,maxwall"])
        qos = checks.run_probe(["sacctmgr", "-nP", "show", "qos", "format=name,maxwall"])
        self.assoc_text = assoc.stdout if assoc is not None and assoc.returncode == 0 else None
        self.qos_wall = limits.parse_qos_maxwall(qos.stdout) if qos is not None and qos.returncode == 0 else None
        self.user = user

    @staticmethod
    def _partitions() -> tuple[dict, str]:
        proc = checks.run_probe(["scontrol", "show", "partition", "-o"])
        parts = limits.parse_partitions(proc.stdout) if proc is not None and proc.returncode == 0 else {}
        if parts:
            return parts, "scontrol show partition"
        parts = limits.parse_sinfo_limits(checks.run_out(["sinfo", "-h", "-o", "%P %l"]))
        return parts, "sinfo"

    def of(self, partition: str | None) -> tuple[list[tuple[str, int | None]], list[str]]:
        """([(where, minutes or None)], [what could not be read]) for a job on `partition`."""
        found, unread = [], []
        name = partition or limits.default_partition(self.partitions)
        fields = self.partitions.get(name or "")
        qos_names = []
        if fields is None:
            unread.append(f"partition {partition or '(default)'}: not in `scontrol show partition` / `sinfo`")
        else:
            self._add(found, unread, f"partition {name} MaxTime", fields.get("MaxTime", ""))
            qos_names += [q for q in [limits.partition_qos(fields)] if q]
        if self.assoc_text is None:
            unread.append("QOS and association MaxWall: sacctmgr does not answer (no slurmdbd?)")
        else:
            assocs = limits.parse_assoc(self.assoc_text, self.account, name)
            if not assocs:
                unread.append(f"QOS and association MaxWall: sacctmgr lists no association for {self.user}")
            for assoc in assocs:
                self._add(found, unread, f"association {assoc['account']} MaxWall", assoc["maxwall"])
                qos_names.append(limits.job_qos(assoc))
        for qos in dict.fromkeys(qos_names):
            if self.qos_wall is None or qos not in self.qos_wall:
                unread.append(f"QOS {qos}: MaxWall not readable with sacctmgr")
            else:
                self._add(found, unread, f"QOS {qos} MaxWall", self.qos_wall[qos])
        return found, unread

    @staticmethod
    def _add(found: list, unread: list, where: str, text: str) -> None:
        try:
            found.append((where, limits.slurm_minutes(text)))
        except ValueError:
            unread.append(f"{where}: {text!r} is not a SLURM time")


def account_row(account: str | None) -> Check:
    user = capacity.slurm_user()
    proc = checks.run_probe(["sacctmgr", "-nP", "show", "assoc", f"user={user}", "format=account"])
    if proc is None or proc.returncode != 0:
        # No accounting daemon (or no sacctmgr): unknown, not "ok".
        return Check("slurm account", WARN, f"{account or 'none set'}: sacctmgr cannot answer for "
                     f"{user}", "ask the site which account to use (cluster.account)")
    known = proc.stdout.split()
    if account is None and known:
        # The plugin would guess one from sacct, and 2.8's guess is broken (it passes the
        # pipe of its command line as an argument): name it.
        return Check("slurm account", FAIL, "cluster.account is null (the plugin's guess is broken)",
                     f"set cluster.account to one of {', '.join(sorted(set(known)))}")
    if account is None:
        return Check("slurm account", OK, f"none needed (sacctmgr lists no account for {user})")
    if known and account not in known:
        return Check("slurm account", FAIL, f"{account} not among {user}'s accounts {sorted(set(known))}",
                     "set cluster.account to one of them")
    return Check("slurm account", OK, account + ("" if known else " (sacctmgr lists no association)"))
