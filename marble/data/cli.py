"""`marble data {assemble,tiny,embed}`."""

from __future__ import annotations

import argparse
import logging
import sys

from marble.data.assemble import SPLITS
from marble.data.records import DataError
from marble.runtime.oserrors import not_a_folder, print_write_failure


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="marble data", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    a = sub.add_parser("assemble", help="raw prompt files -> {split}.parquet with reward masks")
    a.add_argument("--raw-dir", required=True)
    a.add_argument("--out-dir", required=True)
    a.add_argument("--split", choices=[*SPLITS, "all"], default="all")
    a.add_argument("--rewards", help="comma-separated reward names (default: the config's rewards)")
    a.add_argument("--sources", help="comma-separated sources that must exist (default: all present)")
    a.add_argument("--config", action="append", default=[], help="config YAML (repeatable)")
    a.add_argument("--preset", help="config preset naming the rewards")

    t = sub.add_parser("tiny", help="write the generated tiny prompt set in the raw layout")
    t.add_argument("--out", required=True)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--n-train", type=int, default=48)
    t.add_argument("--n-test", type=int, default=12)

    e = sub.add_parser("embed", help="cache the text-encoder outputs of every unique prompt")
    e.add_argument("--table", action="append", required=True, help="assembled parquet (repeatable)")
    e.add_argument("--model", required=True, help="diffusers SD3 folder or hub id")
    e.add_argument("--out", required=True)
    e.add_argument("--max-sequence-length", type=int, default=128)
    e.add_argument("--batch-size", type=int, default=16)
    e.add_argument("--shard-size", type=int, default=1024, help="prompts per safetensors shard")
    e.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32",
                   help="encoder and storage precision (float16 halves the cache)")
    e.add_argument("--device", default="cpu", help="device of the text encoders (cuda on a GPU node)")
    return p


def _csv(value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


def _reward_specs(args) -> list:
    """The rewards whose masks the tables get: --rewards names (with the config's spec of each
    where it has one: its applies_to and mask options), else the config's rewards."""
    from marble.config import RewardSpec, load_config

    specs = load_config(args.preset, args.config).rewards if args.preset or args.config else []
    by_name = {s.name: s for s in specs}
    names = _csv(args.rewards) or [s.name for s in specs]
    if not names:
        raise DataError("name the rewards: --rewards a,b,... or --preset/--config")
    return [by_name.get(name) or RewardSpec(name=name) for name in names]


def cmd_assemble(args) -> int:
    from marble.data.assemble import assemble_split, write_assembled
    from marble.rewards import build_masks

    rewards = build_masks(_reward_specs(args))
    splits = list(SPLITS) if args.split == "all" else [args.split]
    parts = [assemble_split(args.raw_dir, s, rewards, _csv(args.sources)) for s in splits]
    for path in write_assembled(args.out_dir, parts):
        print(f"wrote {path}")
    for part in parts:
        print(f"\n{part.split}:\n{part.summary.to_string(index=False)}")
    return 0


def cmd_tiny(args) -> int:
    from marble.data.tiny_prompts import write_tiny_raw

    for rel, n in write_tiny_raw(args.out, args.seed, args.n_train, args.n_test).items():
        print(f"{args.out}/{rel}: {n}")
    return 0


def cmd_embed(args) -> int:
    from marble.data.embed_cache import build_cache

    stats = build_cache(args.table, args.model, args.out, args.max_sequence_length,
                        args.batch_size, args.shard_size, dtype=args.dtype, device=args.device)
    print(f"embed cache {args.out}: {stats['unique']} unique prompts, {stats['encoded']} encoded, "
          f"{stats['cached']} already cached")
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    args = _parser().parse_args(argv)
    handler = {"assemble": cmd_assemble, "tiny": cmd_tiny, "embed": cmd_embed}[args.cmd]
    flag, out = ("--out-dir", args.out_dir) if args.cmd == "assemble" else ("--out", args.out)
    problem = not_a_folder(out, flag)  # checked before any work, not found by mkdir in a traceback
    if problem:
        print(f"marble data {args.cmd}: error: {problem}", file=sys.stderr)
        return 1
    try:
        return handler(args)
    except (ValueError, FileNotFoundError, KeyError) as exc:  # DataError, ConfigError
        print(f"marble data {args.cmd}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the final writes: a full disk, a read-only folder
        return print_write_failure(f"marble data {args.cmd}", exc, out, status=1)


if __name__ == "__main__":
    raise SystemExit(main())
