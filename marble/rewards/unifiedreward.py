"""UnifiedReward: a VLM judge behind an OpenAI-compatible chat endpoint (an sglang server).

One request per image (PNG, resized to 512, base64), temperature 0, bounded concurrency,
a whole-request deadline (`timeout_s` bounds connect + send + every read together, so a
server trickling bytes cannot stall past it), retries with exponential backoff. The judge
prompt and the request's model name are the reference's, verbatim (flow_grpo/rewards.py
`unifiedreward_score_sglang`), and the score is the number after "Final Score:" divided
by `score_scale` (5, as the reference: 0.2..1).

`reference_rules: true` (default) reproduces the reference's parsing: the first
"Final Score: [1-5]" match, and a reply without one scores 0 (a judgement).
`reference_rules: false`: the last "Final Score: <number>" (markdown bold allowed), a reply
without one is NaN, and a number outside `score_range` (the 1..5 the judge is asked for) is
NaN with a warning, never a score.
Either way a *failed request* (HTTP error after its retries, timeout, connection error,
an undecodable or malformed body) is NaN, never 0 (the reference would crash there), and
flagged in `failed_rows`, so evaluation stores it as missing and a rerun retries it.
Failures are counted by kind, and when the failed requests (plus unparsable replies
without reference_rules) exceed `max_failure_fraction` of a call, RewardServiceError
aborts it. The server URL comes from the `base_url` option, else $MARBLE_UNIFIEDREWARD_URL;
the key only from the environment variable `api_key_env`.
"""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import os
import re
from collections import Counter

import torch

from marble.rewards.base import Reward, RewardServiceError, to_pil

log = logging.getLogger(__name__)
_FINAL_SCORE = re.compile(r"Final Score:\s*\**\s*([-+]?\d+(?:\.\d+)?)", re.IGNORECASE)
# The reference's pattern: case-sensitive, a leading digit 1-5, first match only.
_REFERENCE_FINAL_SCORE = re.compile(r"Final Score:\s*([1-5](?:\.\d+)?)")
_RETRYABLE_STATUS = {408, 429, 500, 502, 503, 504}
# Kinds that are judgements, not failed requests: a rerun at temperature 0 would get the same.
JUDGEMENT_KINDS = frozenset({"unparsable", "out_of_scale"})
# The reference sends this model name (its sglang server serves CodeGoat24/UnifiedReward-7b-v1.5
# under --model-path; sglang answers any name, a vLLM/--served-model-name server may not).
REFERENCE_MODEL_NAME = "UnifiedReward-7b-v1.5"
DEFAULT_BASE_URL = "http://127.0.0.1:17140/v1"
BASE_URL_ENV = "MARBLE_UNIFIEDREWARD_URL"

# The reference's judge prompt, character for character (it is part of the reward's definition).
QUESTION = (
    "<image>\nYou are given a text caption and a generated image based on that caption. Your task is to "
    "evaluate this image based on two key criteria:\n1. Alignment with the Caption: Assess how well this image "
    "aligns with the provided caption. Consider the accuracy of depicted objects, their relationships, and "
    "attributes as described in the caption.\n2. Overall Image Quality: Examine the visual quality of this "
    "image, including clarity, detail preservation, color accuracy, and overall aesthetic appeal.\nBased on "
    "the above criteria, assign a score from 1 to 5 after 'Final Score:'.\nYour task is provided as follows:"
    "\nText Caption: [{prompt}]"
)


def parse_final_score(text: str, reference: bool = False) -> float:
    """The number after 'Final Score:' in a reply (raw, 1-5 scale), or NaN when there is none.

    reference=True: the reference's rule (first match of 'Final Score: [1-5](.d+)?');
    else the last 'Final Score:' number, tolerating markdown bold and any case.
    """
    if reference:
        match = _REFERENCE_FINAL_SCORE.search(text or "")
        return float(match.group(1)) if match else float("nan")
    matches = _FINAL_SCORE.findall(text or "")
    return float(matches[-1]) if matches else float("nan")


def png_data_url(image, size: int = 512) -> str:
    buf = io.BytesIO()
    image.convert("RGB").resize((size, size)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


class UnifiedReward(Reward):
    """Applies to every prompt; needs a running server (see docs/rewards.md)."""

    name = "unifiedreward"

    def __init__(self, base_url: str | None = None, model: str = REFERENCE_MODEL_NAME,
                 api_key_env: str = "MARBLE_UNIFIEDREWARD_API_KEY", concurrency: int = 16,
                 timeout_s: float = 120.0, retries: int = 2, backoff_s: float = 0.5,
                 max_failure_fraction: float = 0.5, image_size: int = 512, score_scale: float = 5.0,
                 reference_rules: bool = True, score_range: tuple[float, float] = (1.0, 5.0), **kw):
        super().__init__(**kw)
        if float(score_scale) <= 0:
            raise ValueError(f"unifiedreward: score_scale must be > 0, got {score_scale!r}")
        base_url = base_url or os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.score_scale, self.reference_rules = float(score_scale), bool(reference_rules)
        low, high = (float(v) for v in score_range)
        if not low <= high:
            raise ValueError(f"unifiedreward: score_range must be [low, high], got {score_range!r}")
        self.score_range = (low, high)
        self.model, self.api_key_env = model, api_key_env
        self.concurrency, self.timeout_s = int(concurrency), float(timeout_s)
        self.retries, self.backoff_s = int(retries), float(backoff_s)
        self.max_failure_fraction, self.image_size = float(max_failure_fraction), int(image_size)
        self.failure_kinds: Counter[str] = Counter()
        self.failed_rows: torch.Tensor | None = None  # per row of the last `score`: a request failed

    def headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env)  # secrets only from the environment
        return {"Authorization": f"Bearer {key}"} if key else {}

    def payload(self, image, prompt: str) -> dict:
        content = [
            {"type": "image_url", "image_url": {"url": png_data_url(image, self.image_size)}},
            {"type": "text", "text": QUESTION.format(prompt=prompt)},
        ]
        return {"model": self.model, "messages": [{"role": "user", "content": content}], "temperature": 0.0}

    def judge(self, text: str) -> tuple[float, str | None]:
        """(raw score, None), or (NaN, judgement kind) for a reply without a usable score."""
        score = parse_final_score(text, reference=self.reference_rules)
        if score != score:
            return score, "unparsable"
        low, high = self.score_range
        if not self.reference_rules and not low <= score <= high:
            # A number the judge was not asked for (e.g. 99999) is no judgement on its scale.
            log.warning("unifiedreward: reply score %s outside %s..%s: NaN", score, low, high)
            return float("nan"), "out_of_scale"
        return score, None

    async def _attempt(self, client, sem, body) -> tuple[float, str | None, bool]:
        """One request: (score, kind or None, retryable). The deadline covers the whole
        request (queueing on the semaphore excluded): httpx's timeout is per read only."""
        import httpx

        try:
            async with sem:
                resp = await asyncio.wait_for(client.post(self.url, json=body, headers=self.headers()),
                                              self.timeout_s)
        except (asyncio.TimeoutError, httpx.TimeoutException):
            return float("nan"), "timeout", True
        except httpx.DecodingError:  # e.g. a corrupt gzip body
            return float("nan"), "decoding", True
        except httpx.HTTPError:  # transport errors: refused, reset, protocol
            return float("nan"), "connection", True
        if resp.status_code != 200:
            return float("nan"), f"http_{resp.status_code}", resp.status_code in _RETRYABLE_STATUS
        try:
            text = resp.json()["choices"][0]["message"]["content"]
            if not isinstance(text, str):
                raise TypeError(f"content is {type(text).__name__}")
        except (ValueError, KeyError, IndexError, TypeError):  # ValueError covers bad JSON/UTF-8
            return float("nan"), "bad_response", False
        return (*self.judge(text), False)

    async def _request(self, client, sem, image, prompt: str) -> tuple[float, str | None]:
        """(score, failure kind or None); retries transient errors with exponential backoff."""
        body, kind = self.payload(image, prompt), "other"
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            score, kind, retryable = await self._attempt(client, sem, body)
            if not retryable:
                return score, kind
        return float("nan"), kind

    async def _score_all(self, images, prompts) -> list[tuple[float, str | None]]:
        import httpx

        sem = asyncio.Semaphore(self.concurrency)
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            return await asyncio.gather(*(self._request(client, sem, im, p) for im, p in zip(images, prompts)))

    def score(self, images, prompts, metadata):
        results = asyncio.run(self._score_all(to_pil(images), prompts))
        kinds = Counter(kind for _, kind in results if kind)
        self.failure_kinds.update(kinds)
        failed = sum(kinds.values())
        if failed:
            log.warning("unifiedreward: %d/%d requests failed: %s", failed, len(results), dict(kinds))
        requests_failed = [kind is not None and kind not in JUDGEMENT_KINDS for _, kind in results]
        # Under the reference's rules an unparsable reply is a judgement (scored 0, as there),
        # not a sign of a dead server: only failed requests count towards the abort.
        fatal = sum(requests_failed) if self.reference_rules else failed
        if fatal > self.max_failure_fraction * len(results):
            self.failures += failed
            raise RewardServiceError(
                f"unifiedreward: {failed}/{len(results)} requests to {self.url} failed ({dict(kinds)}), more than "
                f"max_failure_fraction={self.max_failure_fraction}; is the sglang server up (docs/rewards.md)?"
            )
        scores = torch.tensor([s for s, _ in results], dtype=torch.float64) / self.score_scale
        self.failed_rows = torch.tensor(requests_failed, dtype=torch.bool)
        if self.reference_rules:
            # The reference scores a reply without a score 0: a judgement, counted here, as
            # the base class only counts NaN. A failed request stays NaN (never a valid 0).
            unparsable = torch.tensor([kind == "unparsable" for _, kind in results], dtype=torch.bool)
            self.failures += int(unparsable.sum())
            scores = torch.where(unparsable, torch.zeros_like(scores), scores)
        return scores.to(torch.float32)

    def counters(self):
        return {**super().counters(), **{f"failed_{k}": v for k, v in self.failure_kinds.items()}}
