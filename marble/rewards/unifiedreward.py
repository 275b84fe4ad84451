"""UnifiedReward: a VLM judge behind an OpenAI-compatible chat endpoint (an sglang server).

One request per image (PNG, resized to 512, base64), temperature 0, bounded concurrency,
timeout, retries with exponential backoff. The score is the number after "Final Score:"
on the 1-5 scale, kept raw; an unparsable or failed reply is NaN (never 0) and counted by
kind. When a call's failures exceed `max_failure_fraction`, RewardServiceError aborts it.
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
_RETRYABLE_STATUS = {408, 429, 500, 502, 503, 504}

QUESTION = (
    "<image>\nYou are given a text caption and an image generated from it. Evaluate the image on two criteria:\n"
    "1. Alignment with the caption: how accurately the image shows the objects, attributes and relations the "
    "caption describes.\n"
    "2. Overall image quality: clarity, detail, colour accuracy and aesthetic appeal.\n"
    "Considering both, give a score from 1 to 5 after 'Final Score:'.\n"
    "Text Caption: [{prompt}]"
)


def parse_final_score(text: str) -> float:
    """The number after the last 'Final Score:' in a reply, or NaN when there is none."""
    matches = _FINAL_SCORE.findall(text or "")
    return float(matches[-1]) if matches else float("nan")


def png_data_url(image, size: int = 512) -> str:
    buf = io.BytesIO()
    image.convert("RGB").resize((size, size)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


class UnifiedReward(Reward):
    """Applies to every prompt; needs a running server (see docs/rewards.md)."""

    name = "unifiedreward"

    def __init__(self, base_url: str = "http://127.0.0.1:17140/v1", model: str = "CodeGoat24/UnifiedReward-7b-v1.5",
                 api_key_env: str = "MARBLE_UNIFIEDREWARD_API_KEY", concurrency: int = 16,
                 timeout_s: float = 120.0, retries: int = 2, backoff_s: float = 0.5,
                 max_failure_fraction: float = 0.5, image_size: int = 512, **kw):
        super().__init__(**kw)
        self.url = base_url.rstrip("/") + "/chat/completions"
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
                score = parse_final_score(text)
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
        if failed > self.max_failure_fraction * len(results):
            self.failures += failed
            raise RewardServiceError(
                f"unifiedreward: {failed}/{len(results)} requests to {self.url} failed ({dict(kinds)}), more than "
                f"max_failure_fraction={self.max_failure_fraction}; is the sglang server up (docs/rewards.md)?"
            )
        return torch.tensor([s for s, _ in results], dtype=torch.float32)

    def counters(self):
        return {**super().counters(), **{f"failed_{k}": v for k, v in self.failure_kinds.items()}}
