"""The `claim` experiment's runs from config.yaml's `claim:` section (docs/claim.md).

Arms are data: `claim.arms.<name>: {preset, set}`; every arm trains once per seed in
`claim.seeds`, for `claim.max_steps` steps (an arm's own `max_steps` wins), with the
section's `set:` first, then the arm's, then `train.seed=<seed>`. Run folders are
`results/claim/runs/<arm>-s<seed>`; `-` never occurs in an arm name (the schema), so the
folder name parses back. Every run evaluates the held-out split at step 0 and at its last
step (`train.eval_every` = its steps, marble.training.heldout): the claim's change of a
reward is the difference of the two. Torch-free: the Snakemake DAG build uses it.

Issue 36 (noise told from conflict, replication): `claim.sweep` adds each listed arm again at
other micro-batch sizes (`<arm>_mb<size>`: `train.batch_size=<size>`, the same samples per
step, so fewer, larger micro-batches); `claim.control` trains listed arms on rewards that
cannot conflict (`control_<arm>`: `claim.control.rewards`, by default toy_brightness and its
copy on the OCR prompts); `claim.pretrain_per_seed` gives each seed its own pretrained tiny
model (`data/models/claim/<model>-s<seed>`, pretraining keyed by that seed).
"""

from __future__ import annotations

import json
import os

from marble.workflow.runs import configured

CLAIM_DIR = "results/claim"
ZOO_DIR = "results/zoo"  # the zoo: the claim's machinery with every balancer (zoo.smk)


def arms(section: dict) -> dict[str, dict]:
    """arm name -> run spec ({preset, max_steps, set}) with the section's defaults filled in;
    arms nulled by an overlay are left out."""
    out = {}
    for name, spec in configured(section.get("arms")).items():
        steps = spec.get("max_steps") or section["max_steps"]
        out[name] = {"preset": spec["preset"], "max_steps": steps,
                     "set": _evaluated(steps) + list(section.get("set", [])) + list(spec.get("set", []))}
    return out


def _evaluated(steps: int) -> list[str]:
    """The held-out evaluations the claim measures by: at step 0 and at the last step."""
    return [f"train.eval_every={int(steps)}"]


def zoo_section(config: dict) -> dict:
    """config.yaml's `zoo:` over the claim section's defaults (the schema's $ref validates its
    keys but fills none); a config without `zoo:` (the paper ones) has no zoo arms."""
    claim = config["claim"]
    keys = ("seeds", "max_steps", "marble_arm", "baseline_arm", "effect_of_interest")
    return {**{k: claim[k] for k in keys}, "set": [], "arms": {}, **(config.get("zoo") or {})}


def run_name(arm: str, seed: int) -> str:
    return f"{arm}-s{int(seed)}"


def parse_run_name(name: str) -> tuple[str, int]:
    """(arm, seed) of a run folder name; ValueError naming it otherwise."""
    arm, sep, seed = name.rpartition("-s")
    if not sep or not arm or not seed.isdigit():
        raise ValueError(f"claim run folder {name!r} is not <arm>-s<seed>")
    return arm, int(seed)


ALONE_PREFIX = "alone_"
CONTROL_PREFIX = "control_"
SWEEP_INFIX = "_mb"  # <arm>_mb<size>: the arm at train.batch_size=<size>
CLAIM_MODELS_DIR = "data/models/claim"


def sweep_arms(section: dict) -> dict[str, dict]:
    """`<arm>_mb<size>` -> spec: each arm of `sweep.arms` again with `train.batch_size=<size>`
    for every size of `sweep.micro_batch` (the rollouts per step stay the preset's, so only the
    micro-batch size and with it the micro-steps per step change)."""
    sweep = section.get("sweep") or {}
    base = arms(section)
    out = {}
    for arm in sweep.get("arms", []):
        if arm not in base:
            raise ValueError(f"claim.sweep.arms: {arm!r} is not a claim arm ({', '.join(base) or 'none'})")
        for size in sweep.get("micro_batch", []):
            spec = base[arm]
            out[f"{arm}{SWEEP_INFIX}{int(size)}"] = {**spec, "set": spec["set"] + [f"train.batch_size={int(size)}"]}
    return out


def sweep_base(arm: str) -> tuple[str, int] | None:
    """(base arm, micro-batch size) of a sweep arm's name, None for any other arm."""
    base, sep, size = arm.rpartition(SWEEP_INFIX)
    return (base, int(size)) if sep and base and size.isdigit() else None


def control_arms(section: dict) -> dict[str, dict]:
    """`control_<arm>` -> spec: each arm of `control.arms` with `control.rewards` instead of the
    toy rewards: copies of one objective on different prompts, so no reward can oppose another
    and any anti-aligned micro-step is gradient noise (docs/claim.md)."""
    control = section.get("control") or {}
    base = arms(section)
    out = {}
    for arm in control.get("arms", []):
        if arm not in base:
            raise ValueError(f"claim.control.arms: {arm!r} is not a claim arm ({', '.join(base) or 'none'})")
        if not control.get("rewards"):  # the schema's default names them; a bare section does not
            raise ValueError("claim.control.rewards: name the control's rewards (config.yaml's: "
                             "toy_brightness and toy_brightness_copy on the OCR prompts)")
        # JSON is YAML flow syntax: the override parser reads the list as written
        rewards = json.dumps(control["rewards"], separators=(", ", ": "))
        out[f"{CONTROL_PREFIX}{arm}"] = {**base[arm], "set": base[arm]["set"] + [f"rewards={rewards}"]}
    return out


def seed_model_pattern(shared: str) -> str:
    """The per-seed pretrained model's folder, `{seed}` a Snakemake wildcard."""
    return f"{CLAIM_MODELS_DIR}/{os.path.basename(os.path.normpath(shared))}-s{{seed}}"


def model_dir(section: dict, run: str, shared: str) -> str:
    """The pretrained model a claim run starts from: the shared one, or with
    `pretrain_per_seed` its seed's own (issue 36 item 5: seeds vary the starting model too)."""
    if not section.get("pretrain_per_seed"):
        return shared
    return seed_model_pattern(shared).format(seed=parse_run_name(run)[1])


def alone_arms(section: dict) -> dict[str, dict]:
    """`alone_<reward>` -> spec: the learnability check, one reward per run (`claim.alone`),
    on the prompt sources `alone.sources` gives it (a specialist's own prompts, as a
    single-reward run trains on its own dataset: one stage over those sources)."""
    alone = section.get("alone") or {}
    steps = section["max_steps"]
    # an overlay nulls a source entry to drop it (as it nulls an arm)
    sources_of = {r: v for r, v in (alone.get("sources") or {}).items() if v is not None}
    stray = sorted(set(sources_of) - set(alone.get("rewards", [])))
    if stray:  # a misspelt reward would train its specialist on every source, silently
        raise ValueError(f"claim.alone.sources.{stray[0]}: not among claim.alone.rewards "
                         f"({', '.join(alone.get('rewards', [])) or 'none'})")
    out = {}
    for r in alone.get("rewards", []):
        sets = _evaluated(steps) + list(section.get("set", [])) + [f"rewards=[{{name: {r}}}]"]
        sources = sources_of.get(r)
        if sources:
            sets.append(f"stages=[{{name: {r}, steps: {int(steps)}, sources: [{', '.join(sources)}]}}]")
        out[f"{ALONE_PREFIX}{r}"] = {"preset": alone.get("preset", "tiny_weighted_sum"),
                                     "max_steps": steps, "set": sets}
    return out


def priced_arms(section: dict) -> dict[str, dict]:
    """Every arm the verdict reports, with its spec, for the counted-cost rule: the arms, the
    sweep's and the control's (issue 47 item 6: priced from `arms` alone, the sweep arms' cost
    row printed "xn/a"). The alone arms are the learnability check, not a balancer to price."""
    return {**arms(section), **sweep_arms(section), **control_arms(section)}


def runs(section: dict) -> dict[str, dict]:
    """run name -> spec with its seed override: every arm, sweep arm and control arm x
    `seeds`, every alone arm x `alone.seeds`."""
    out = {}
    groups = [(arms(section), section["seeds"]), (sweep_arms(section), section["seeds"]),
              (control_arms(section), section["seeds"]),
              (alone_arms(section), (section.get("alone") or {}).get("seeds", []))]
    for group, seeds in groups:
        for arm, spec in group.items():
            for seed in seeds:
                out[run_name(arm, seed)] = {**spec,
                                            "set": spec["set"] + [f"train.seed={int(seed)}"]}
    return out
