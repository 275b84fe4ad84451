"""UnifiedReward: a VLM judge behind an OpenAI-compatible chat endpoint (an sglang server).

One request per image (PNG, resized to 512, base64), temperature 0, bounded concurrency,
timeout, retries with exponential backoff. The judge prompt is the reference's, verbatim
(flow_grpo/rewards.py `unifiedreward_score_sglang`), and the score is the number after
"Final Score:" divided by `score_scale` (5, as the reference: 0.2..1).

`reference_rules: true` (default) reproduces the reference: the first "Final Score: [1-5]"
match, and a reply without one scores 0; a request that fails after its retries also
scores 0 (the reference would crash there). `reference_rules: false`: the last
"Final Score: <number>" (markdown bold allowed), and failures are NaN (masked). Either way
failures are counted by kind, and when they exceed `max_failure_fraction` of a call
(failed requests only, under reference_rules), RewardServiceError aborts it. The server URL comes from the `base_url` option, else
$MARBLE_UNIFIEDREWARD_URL; the key only from the environment variable `api_key_env`.
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

    def __init__(self, base_url: str | None = None, model: str = "CodeGoat24/UnifiedReward-7b-v1.5",
                 api_key_env: str = "MARBLE_UNIFIEDREWARD_API_KEY", concurrency: int = 16,
                 timeout_s: float = 120.0, retries: int = 2, backoff_s: float = 0.5,
                 max_failure_fraction: float = 0.5, image_size: int = 512, score_scale: float = 5.0,
                 reference_rules: bool = True, **kw):
        super().__init__(**kw)
        if float(score_scale) <= 0:
            raise ValueError(f"unifiedreward: score_scale must be > 0, got {score_scale!r}")
        base_url = base_url or os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.score_scale, self.reference_rules = float(score_scale), bool(reference_rules)
        self.model, self.api_key_env = model, api_key_env
        self.concurrency, self.timeout_s = int(concurrency), float(timeout_s)
        self.retries, self.backoff_s = int(retries), float(backoff_s)
        self.max_failure_fraction, self.image_size = float(max_failure_fraction), int(image_size)
        self.failure_kinds: Counter[str] = Counter()

    def headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env)  # secrets only from the environment
        return {"Authorization": f"Bearer {key}"} if key else {}

    def payload(self, image, prompt: str) -> dict:
        content = [
            {"type": "image_url", "image_url": {"url": png_data_url(image, self.image_size)}},
            {"type": "text", "text": QUESTION.format(prompt=prompt)},
        ]
        return {"model": self.model, "messages": [{"role": "user", "content": content}], "temperature": 0.0}

    async def _request(self, client, sem, image, prompt: str) -> tuple[float, str | None]:
        """(score, failure kind or None); retries transient errors with exponential backoff."""
        import httpx

        body, kind = self.payload(image, prompt), "other"
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                async with sem:
                    resp = await client.post(self.url, json=body, headers=self.headers())
                if resp.status_code != 200:
                    kind = f"http_{resp.status_code}"
                    if resp.status_code in _RETRYABLE_STATUS:
                        continue
                    return float("nan"), kind
                text = resp.json()["choices"][0]["message"]["content"]
                score = parse_final_score(text, reference=self.reference_rules)
                return (score, None) if score == score else (score, "unparsable")
            except httpx.TimeoutException:
                kind = "timeout"
            except httpx.TransportError:
                kind = "connection"
            except (ValueError, KeyError, IndexError, TypeError):
                return float("nan"), "bad_response"
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
        # Under the reference's rules an unparsable reply is a judgement (scored 0, as there),
        # not a sign of a dead server: only failed requests count towards the abort.
        fatal = failed - kinds["unparsable"] if self.reference_rules else failed
        if fatal > self.max_failure_fraction * len(results):
            self.failures += failed
            raise RewardServiceError(
                f"unifiedreward: {failed}/{len(results)} requests to {self.url} failed ({dict(kinds)}), more than "
                f"max_failure_fraction={self.max_failure_fraction}; is the sglang server up (docs/rewards.md)?"
            )
        scores = torch.tensor([s for s, _ in results], dtype=torch.float64) / self.score_scale
        if self.reference_rules and failed:
            # The reference scores a failed judgement 0; count it here, as the base class
            # only counts NaN.
            self.failures += failed
            scores = torch.nan_to_num(scores, nan=0.0)
        return scores.to(torch.float32)

    def counters(self):
        return {**super().counters(), **{f"failed_{k}": v for k, v in self.failure_kinds.items()}}
