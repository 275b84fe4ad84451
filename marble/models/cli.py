"""`marble models tiny --out DIR [--seed 0]`: build and save the tiny SD3 pipeline.
`marble models pretrain --table PARQUET --out DIR [--model DIR]`: teach it to draw
(marble.models.pretrain), so the embedded default's RL run has something to move."""

from __future__ import annotations

import argparse


def _pretrain_parser(sub) -> None:
    from marble.models.pretrain import PretrainSettings

    d = PretrainSettings()
    p = sub.add_parser("pretrain", help="fit the tiny VAE and transformer to draw toy pictures "
                                        "of the training prompts")
    p.add_argument("--model", default="random:tiny",
                   help="pipeline to start from (default: the tiny one built from configs, seed 0)")
    p.add_argument("--table", required=True, help="assembled training table (its prompts)")
    p.add_argument("--out", required=True, help="output folder (diffusers layout + pretrain_summary.json)")
    p.add_argument("--vae-steps", type=int, default=d.vae_steps)
    p.add_argument("--flow-steps", type=int, default=d.flow_steps)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--resolution", type=int, default=d.resolution)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="marble models", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    tiny = sub.add_parser("tiny", help="build the tiny SD3 pipeline from configs and save it")
    tiny.add_argument("--out", required=True, help="output folder (diffusers save_pretrained layout)")
    tiny.add_argument("--seed", type=int, default=0, help="init seed (the build is deterministic)")
    _pretrain_parser(sub)
    args = parser.parse_args(argv)
    import sys

    from marble.runtime.oserrors import not_a_folder, print_write_failure

    prog = f"marble models {args.command}"
    problem = not_a_folder(args.out, "--out")  # found before the build, not by its final rename
    if problem:
        print(f"{prog}: error: {problem}", file=sys.stderr)
        return 2
    try:
        return _pretrain(args) if args.command == "pretrain" else _tiny(args)
    except (ValueError, FileNotFoundError) as exc:  # a table that is not what it says (DataError), none
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the final write: a full disk, a read-only folder
        return print_write_failure(prog, exc, args.out)


def _tiny(args) -> int:
    from marble.models.loading import load_pipeline
    from marble.models.tiny import folder_size_bytes, parameter_count, save_tiny_pipeline

    out = save_tiny_pipeline(args.out, seed=args.seed)
    pipe = load_pipeline(str(out))  # reload: proves the folder loads offline
    print(f"tiny SD3 saved to {out}: {parameter_count(pipe):,} parameters, "
          f"{folder_size_bytes(out) / 2**20:.2f} MiB on disk")
    return 0


def _pretrain(args) -> int:
    import torch

    from marble.data import load_table, records
    from marble.models.pretrain import PretrainSettings, pretrain

    if args.threads:
        torch.set_num_threads(args.threads)
    settings = PretrainSettings(vae_steps=args.vae_steps, flow_steps=args.flow_steps,
                                batch_size=args.batch_size, resolution=args.resolution,
                                seed=args.seed)
    table = records(load_table(args.table))
    if not table:
        raise SystemExit(f"marble models pretrain: {args.table}: no prompts to pretrain on")
    summary = pretrain(args.model, [(r.prompt, r.metadata) for r in table], args.out, settings)
    print(f"pretrained {args.model} on {summary['prompts']} prompts -> {args.out}: "
          f"VAE loss {summary['vae_loss']}, flow loss {summary['flow_loss']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
