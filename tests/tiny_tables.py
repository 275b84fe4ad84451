"""The smallest prompt table the tiny trainer runs on: one prompt per source, the toy
rewards' masks (text contrast on the quoted prompt, colour match on the coloured one)."""

from __future__ import annotations

from pathlib import Path

from marble.data.records import PromptRecord, to_frame


def three_prompt_table(path: Path) -> Path:
    """Write the table to `path` (parquet) and return it."""
    rows = [
        PromptRecord.make("a photo of a red apple", "geneval",
                          {"tag": "color_attr", "include": [{"class": "apple", "count": 1,
                                                             "color": "red"}]}),
        PromptRecord.make('a sign that says "hello"', "ocr"),
        PromptRecord.make("a castle at dawn", "pickscore"),
    ]
    masks = {"toy_brightness": [True] * 3, "toy_saturation": [True] * 3,
             "toy_text_contrast": [False, True, False],
             "toy_color_match": [True, False, False]}
    to_frame(rows, masks).to_parquet(path)
    return path
