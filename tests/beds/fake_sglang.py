"""A loopback stand-in for UnifiedReward's sglang server (`python -m beds.fake_sglang`).

Answers `GET /health` and `GET /v1/models` (readiness, as marble.rewards.service polls) and
`POST /v1/chat/completions` (the OpenAI-compatible call `marble.rewards.unifiedreward`
makes) on 127.0.0.1 and a free port, with a reply that ends in `Final Score: N`, N in 1..5
chosen deterministically from the request's text (sha256 of the judge prompt, mod 5, + 1),
so the same prompt always gets the same judgement. Bounded: it stops by itself after
`idle_s` seconds without a request. For `make test-paper` (no GPU, no VLM); not a judge.

Faults (the fault suite's flaky judge): `faults` is a queue of what the next requests get,
one entry each, then normal replies: `503` (any 3-digit status), `trickle` (a valid reply
sent a byte at a time, `trickle_s` apart), `bad_gzip` (a body labelled gzip that is not),
`score:<text>` (a reply ending "Final Score: <text>", e.g. score:99999). CLI: `--faults 503,trickle`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler

from beds.mirror_server import LoopbackServer

MAX_BODY = 8 << 20  # a 512x512 PNG in base64 is well under this
FAULT = re.compile(r"^(?:\d{3}|trickle|bad_gzip|score:.+)$")


def judge_score(text: str) -> int:
    """The fake judge's score of a prompt text: 1..5, from its sha256."""
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest(), 16) % 5 + 1


def request_text(body: dict) -> str:
    """The text parts of the chat request's messages, joined (the judge prompt with the caption)."""
    parts = []
    for message in body["messages"]:
        content = message["content"]
        if isinstance(content, str):
            parts.append(content)
        else:
            parts.extend(c["text"] for c in content if c.get("type") == "text")
    return "\n".join(parts)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet: the harness logs are enough
        pass

    def _json(self, status: int, obj: dict, fault: str | None = None) -> None:
        data = json.dumps(obj).encode()
        if fault == "bad_gzip":
            data = b"\x1f\x8b this is not gzip"
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if fault == "bad_gzip":
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if fault != "trickle":
            self.wfile.write(data)
            return
        try:  # a server that answers, slowly: each read is quick, the whole reply is not
            for i in range(len(data)):
                self.wfile.write(data[i : i + 1])
                self.wfile.flush()
                time.sleep(self.server.trickle_s)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up, as it should

    def do_GET(self):
        """sglang's readiness endpoints, as marble.rewards.service polls them."""
        self.server.touch()
        if self.path.rstrip("/") == "/health":
            return self._json(200, {"status": "ok"})
        if self.path.rstrip("/") == "/v1/models":
            return self._json(200, {"object": "list", "data": [{"id": "fake", "object": "model"}]})
        return self._json(404, {"error": f"no route {self.path}"})

    def do_POST(self):
        self.server.touch()
        if self.path.rstrip("/") != "/v1/chat/completions":
            return self._json(404, {"error": f"no route {self.path}"})
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            return self._json(413, {"error": "request too large"})
        try:
            body = json.loads(self.rfile.read(length))
            text = request_text(body)
        except (ValueError, KeyError, TypeError) as err:
            return self._json(400, {"error": f"bad request: {err}"})
        self.server.requests += 1
        fault = self.server.next_fault()
        if fault and fault.isdigit():
            return self._json(int(fault), {"error": f"injected {fault}"})
        score = fault.removeprefix("score:") if fault and fault.startswith("score:") else judge_score(text)
        reply = f"The image roughly follows the caption. Final Score: {score}"
        self._json(200, {"id": f"fake-{self.server.requests}", "object": "chat.completion",
                         "model": body.get("model", "fake"),
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": reply},
                                      "finish_reason": "stop"}]}, fault)


class FakeSglangServer(LoopbackServer):
    def __init__(self, port: int = 0, idle_s: float = 300.0, faults=(), trickle_s: float = 0.05):
        super().__init__(Handler, port, idle_s)
        self.requests = 0
        bad = [f for f in faults if not FAULT.match(f)]
        if bad:
            raise ValueError(f"fake_sglang: unknown faults {bad} (503, trickle, bad_gzip, score:<text>)")
        self.faults, self.trickle_s, self._lock = deque(faults), float(trickle_s), threading.Lock()

    def next_fault(self) -> str | None:
        """The fault the current request gets (None: a normal reply); each is used once."""
        with self._lock:  # handlers run in threads
            return self.faults.popleft() if self.faults else None

    @property
    def url(self) -> str:
        """The base URL to give the reward (`base_url` option or MARBLE_UNIFIEDREWARD_URL)."""
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m beds.fake_sglang", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--idle", type=float, default=600.0, help="stop after this many seconds without a request")
    p.add_argument("--faults", default="", help="comma-separated faults for the first requests (see above)")
    args = p.parse_args(argv)
    server = FakeSglangServer(args.port, args.idle, [f for f in args.faults.split(",") if f])
    print(f"fake sglang at {server.url} (MARBLE_UNIFIEDREWARD_URL={server.url}); stops after {args.idle:.0f}s idle",
          flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
