"""A small generated prompt set in the raw layout of the real data (no download needed).

`write_tiny_raw(out)` writes pickscore/{train,test}.txt (free-form), ocr/{train,test}.txt
(quoted-text prompts), geneval/{train,test}_metadata.jsonl (GenEval-style records with
include clauses, all six tags) and drawbench/test.txt. Deterministic in the seed; the
train and test prompts of a source are disjoint.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from marble.rewards.geneval_rules import COLORS  # the one list of GenEval colour names
from marble.runtime.io import write_text

SUBJECTS = ["a red fox", "an old lighthouse", "a cyborg cat", "a tiny robot", "a koi pond",
            "a mountain village", "a vintage car", "a sleeping dragon", "a glass teapot",
            "a desert caravan", "a snowy owl", "a floating island", "a street musician",
            "a sunflower field", "a wooden sailboat", "an astronaut"]
SCENES = ["at sunset", "in the rain", "under neon lights", "on a foggy morning",
          "in a busy market", "at the bottom of the sea", "in a snowy forest", "on the moon"]
STYLES = ["oil painting", "studio photograph", "watercolor", "digital art, trending on artstation",
          "35mm film photo", "isometric 3d render", "ukiyo-e print", "pencil sketch"]
SIGN_OBJECTS = ["a neon sign", "a chalkboard", "a coffee cup", "a t-shirt", "a shop window",
                "a birthday cake", "a street banner", "a book cover", "a wooden plank"]
SIGN_TEXTS = ["Open Late", "Hello World", "Fresh Bread", "Go Team", "No Parking", "Sale 50%",
              "Good Vibes", "Welcome Home", "Stay Curious", "Best Coffee", "Moon Base", "Exit 12"]
CLASSES = ["cat", "dog", "bicycle", "umbrella", "cup", "banana", "chair", "clock", "bench",
           "laptop", "vase", "apple", "bird", "car", "book", "teddy bear"]
POSITIONS = ["left of", "right of", "above", "below"]
NUMBERS = {2: "two", 3: "three", 4: "four"}
DRAWBENCH = ["{s} made of {m}.", "A sign that says '{t}'.", "{s} riding {s2}.",
             "A {c} {o} on top of a {c2} {o2}.", "A storefront with '{t}' written on it."]


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _plural(word: str) -> str:
    return word + ("es" if word.endswith(("h", "s")) else "s")


def _pickscore(rng: random.Random) -> str:
    return f"{rng.choice(SUBJECTS)} {rng.choice(SCENES)}, {rng.choice(STYLES)}"


def _ocr(rng: random.Random) -> str:
    return f'{rng.choice(SIGN_OBJECTS)} with the words "{rng.choice(SIGN_TEXTS)}", {rng.choice(STYLES)}'


def _geneval(rng: random.Random, tag: str) -> dict:
    a, b = rng.sample(CLASSES, 2)
    ca, cb = rng.sample(COLORS, 2)
    if tag == "single_object":
        return {"tag": tag, "include": [{"class": a, "count": 1}], "prompt": f"a photo of {_article(a)} {a}"}
    if tag == "two_object":
        inc = [{"class": a, "count": 1}, {"class": b, "count": 1}]
        return {"tag": tag, "include": inc, "prompt": f"a photo of {_article(a)} {a} and {_article(b)} {b}"}
    if tag == "counting":
        n = rng.choice(sorted(NUMBERS))
        return {"tag": tag, "include": [{"class": a, "count": n}], "exclude": [{"class": a, "count": n + 1}],
                "prompt": f"a photo of {NUMBERS[n]} {_plural(a)}"}
    if tag == "colors":
        return {"tag": tag, "include": [{"class": a, "count": 1, "color": ca}],
                "prompt": f"a photo of {_article(ca)} {ca} {a}"}
    if tag == "position":
        rel = rng.choice(POSITIONS)
        inc = [{"class": a, "count": 1}, {"class": b, "count": 1, "position": [rel, 0]}]
        return {"tag": tag, "include": inc, "prompt": f"a photo of {_article(b)} {b} {rel} {_article(a)} {a}"}
    inc = [{"class": a, "count": 1, "color": ca}, {"class": b, "count": 1, "color": cb}]
    return {"tag": "color_attr", "include": inc,
            "prompt": f"a photo of {_article(ca)} {ca} {a} and {_article(cb)} {cb} {b}"}


GENEVAL_TAGS = ["single_object", "two_object", "counting", "colors", "position", "color_attr"]


def _drawbench(rng: random.Random) -> str:
    a, b = rng.sample(CLASSES, 2)
    ca, cb = rng.sample(COLORS, 2)
    template = rng.choice(DRAWBENCH)
    return template.format(s=rng.choice(SUBJECTS), s2=rng.choice(SUBJECTS), m=rng.choice(["glass", "paper", "lego"]),
                           t=rng.choice(SIGN_TEXTS), c=ca, o=a, c2=cb, o2=b)


def _unique(make, n: int, key=lambda x: x, max_tries: int = 100_000) -> list:
    """n distinct items from a generator (distinct by `key`)."""
    seen, out = set(), []
    for _ in range(max_tries):
        item = make()
        if key(item) not in seen:
            seen.add(key(item))
            out.append(item)
            if len(out) == n:
                return out
    raise ValueError(f"could not generate {n} distinct tiny prompts; lower --n-train/--n-test")


def tiny_prompt_sets(seed: int = 0, n_train: int = 48, n_test: int = 12) -> dict[str, dict[str, list]]:
    """{source: {split: items}}; items are strings, or dicts for geneval."""
    rng = random.Random(seed)
    n = n_train + n_test
    tags = iter(GENEVAL_TAGS * (n // len(GENEVAL_TAGS) + 100_000))
    pools = {
        "pickscore": _unique(lambda: _pickscore(rng), n),
        "ocr": _unique(lambda: _ocr(rng), n),
        "geneval": _unique(lambda: _geneval(rng, next(tags)), n, key=lambda r: r["prompt"]),
    }
    sets = {name: {"train": pool[:n_train], "test": pool[n_train:]} for name, pool in pools.items()}
    sets["drawbench"] = {"test": _unique(lambda: _drawbench(rng), n_test)}
    return sets


def write_tiny_raw(out: str | Path, seed: int = 0, n_train: int = 48, n_test: int = 12) -> dict[str, int]:
    """Write the raw layout under `out`; returns {relative file: records}."""
    out = Path(out)
    written = {}
    for source, splits in tiny_prompt_sets(seed, n_train, n_test).items():
        for split, items in splits.items():
            if source == "geneval":
                rel = f"geneval/{split}_metadata.jsonl"
                text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in items)
            else:
                rel = f"{source}/{split}.txt"
                text = "".join(p + "\n" for p in items)
            write_text(out / rel, text)
            written[rel] = len(items)
    return written
