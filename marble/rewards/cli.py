"""`marble rewards list` and `marble rewards score --reward NAME --image F --prompt P`."""

from __future__ import annotations

import argparse
import json
import sys

import yaml

from marble.runtime.io import json_text


def parse_options(pairs: list[str]) -> dict:
    """`key=value` pairs; values parsed as YAML scalars (numbers, booleans, lists)."""
    options = {}
    for pair in pairs:
        if "=" not in pair:
            raise SystemExit(f"marble rewards: --option expects key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        options[key] = yaml.safe_load(value)
    return options


def load_image(path: str):
    import numpy as np
    import torch
    from PIL import Image

    with Image.open(path) as im:
        arr = np.array(im.convert("RGB"))
    return torch.from_numpy(arr).permute(2, 0, 1).float().div(255.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="marble rewards", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="print the registered reward names")
    score = sub.add_parser("score", help="score images with one reward, print JSON lines")
    score.add_argument("--reward", required=True)
    score.add_argument("--image", required=True, nargs="+", help="image files")
    score.add_argument("--prompt", required=True, help="the prompt (same for every image)")
    score.add_argument("--metadata", default="{}", help="JSON metadata record (e.g. a GenEval line)")
    score.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                       help="reward option, repeatable (e.g. model=openai/clip-vit-large-patch14)")
    bench = sub.add_parser("bench", help="images/s of one reward on random or given images (prints)")
    bench.add_argument("--reward", required=True)
    bench.add_argument("--n", type=int, default=16, help="images per call")
    bench.add_argument("--size", type=int, default=512, help="random image side")
    bench.add_argument("--image", default=None, help="repeat this file instead of random pixels")
    bench.add_argument("--prompt", default='a sign that says "hello world"')
    bench.add_argument("--metadata", default="{}")
    bench.add_argument("--repeats", type=int, default=2)
    bench.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)

    from marble.rewards import available, build

    if args.cmd == "list":
        print("\n".join(available()))
        return 0
    try:
        metadata = json.loads(args.metadata)
    except json.JSONDecodeError as err:
        parser.error(f"--metadata is not JSON: {err}")
    reward = build(args.reward, **parse_options(args.option))
    if args.cmd == "bench":
        return run_bench(reward, args, metadata)
    for path in args.image:  # one at a time: files may differ in size
        value = reward(load_image(path)[None], [args.prompt], [metadata])[0].item()
        print(json_text({"image": path, "reward": args.reward, "score": value}))  # NaN, inf: null
    print(json.dumps({"counters": reward.counters()}), file=sys.stderr)
    return 0


def run_bench(reward, args, metadata: dict) -> int:
    """Warm-up call, then `repeats` timed calls; prints images/s (benchmarks print, tests do not time)."""
    import time

    import torch

    if args.image:
        images = load_image(args.image)[None].repeat(args.n, 1, 1, 1)
    else:
        images = torch.rand(args.n, 3, args.size, args.size, generator=torch.Generator().manual_seed(0))
    prompts, metas = [args.prompt] * args.n, [metadata] * args.n
    reward(images[:1], prompts[:1], metas[:1])
    start = time.perf_counter()
    for _ in range(args.repeats):
        scores = reward(images, prompts, metas)
    rate = args.n * args.repeats / (time.perf_counter() - start)
    print(json_text({"reward": args.reward, "images_per_s": round(rate, 2), "n": args.n,
                      "shape": list(images.shape[1:]), "mean_score": float(scores.nanmean())}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
