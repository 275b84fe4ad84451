"""`marble models tiny --out DIR [--seed 0]`: build and save the tiny SD3 pipeline."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="marble models", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    tiny = sub.add_parser("tiny", help="build the tiny SD3 pipeline from configs and save it")
    tiny.add_argument("--out", required=True, help="output folder (diffusers save_pretrained layout)")
    tiny.add_argument("--seed", type=int, default=0, help="init seed (the build is deterministic)")
    args = parser.parse_args(argv)

    from marble.models.loading import load_pipeline
    from marble.models.tiny import folder_size_bytes, parameter_count, save_tiny_pipeline

    out = save_tiny_pipeline(args.out, seed=args.seed)
    pipe = load_pipeline(str(out))  # reload: proves the folder loads offline
    print(f"tiny SD3 saved to {out}: {parameter_count(pipe):,} parameters, "
          f"{folder_size_bytes(out) / 2**20:.2f} MiB on disk")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
