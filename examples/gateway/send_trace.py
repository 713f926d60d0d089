"""Sends Mooncake trace conversations through a gateway and reports the workers' prefix-cache
hit ratio.

    python send_trace.py --gateway http://127.0.0.1:8000 --workers http://127.0.0.1:8001,... \\
        --trace data/mooncake/conversation_trace.jsonl --requests 300

The trace's requests carry `hash_ids` (one per block of the original prompt); turns of one
conversation repeat the earlier turns' ids. It takes the first 90 conversations with more
than one turn (a conversation = the requests sharing their second hash id; the first is a
shared system prompt), sends their turns in trace order as /v1/completions (every tenth as
/v1/chat/completions), and reads the hit ratio the workers measured (GET /stats): blocks the
chosen worker already held / prompt blocks.
"""
import argparse
import json
import urllib.request
from collections import Counter
from typing import Dict, List, Sequence, Tuple

from common import MODEL, trace_prompt


def conversation_requests(trace: str, count: int, conversations: int = 90) -> List[List[int]]:
    """The `hash_ids` of the turns of the trace's first `conversations` multi-turn
    conversations, in trace order, at most `count` of them."""
    with open(trace) as f:
        requests = [json.loads(line)["hash_ids"] for line in f if line.strip()]
    turns = Counter(ids[1] for ids in requests if len(ids) > 1)
    chosen: set = set()
    for ids in requests:
        if len(chosen) == conversations:
            break
        if len(ids) > 1 and turns[ids[1]] > 1:
            chosen.add(ids[1])
    return [ids for ids in requests if len(ids) > 1 and ids[1] in chosen][:count]


def post(url: str, body: dict):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read()), dict(resp.headers)


def request_for(i: int, ids: Sequence[int]) -> Tuple[str, dict]:
    """(path, body) of the i-th request: every tenth a chat completion, the others completions."""
    text = trace_prompt(ids)
    if i % 10 == 9:
        return "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    return "/v1/completions", {"model": MODEL, "prompt": text, "max_tokens": 1}


def send(gateway: str, requests: Sequence[Sequence[int]]) -> List[Dict[str, str]]:
    """Sends each request through the gateway (one at a time); returns the routing headers."""
    routed = []
    for i, ids in enumerate(requests):
        path, body = request_for(i, ids)
        _, headers = post(gateway + path, body)
        routed.append({k.lower(): v for k, v in headers.items() if k.lower().startswith("x-prefixlog")})
    return routed


def hit_ratio(workers: Sequence[str]) -> float:
    """Blocks already cached / prompt blocks, over all workers (their GET /stats)."""
    stats = [json.loads(urllib.request.urlopen(w + "/stats", timeout=10).read()) for w in workers]
    blocks = sum(s["prompt_blocks"] for s in stats)
    return sum(s["hit_blocks"] for s in stats) / blocks if blocks else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gateway", required=True)
    ap.add_argument("--workers", required=True, help="the fake workers' base URLs, comma separated")
    ap.add_argument("--trace", required=True)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--conversations", type=int, default=90)
    a = ap.parse_args()
    routed = send(a.gateway, conversation_requests(a.trace, a.requests, a.conversations))
    print("routes:", dict(Counter(r["x-prefixlog-route"].split(":")[0] for r in routed)))
    print("workers:", dict(Counter(r["x-prefixlog-worker"] for r in routed)))
    print(f"prefix hit ratio: {hit_ratio(a.workers.split(',')):.3f}")


if __name__ == "__main__":
    main()
