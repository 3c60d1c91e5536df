"""A small load generator for `encore serve` (until `encore bench serve` exists):
N concurrent streaming /v1/completions clients, each with a random prompt of token ids and
a fixed number of output tokens (ignore_eos), all started at once. Reports request and
output-token throughput (tokens counted from the usage chunk), TTFT and the latency
between streamed chunks (mean / p50 / p90 / p99).

    python3 scripts/serve_load.py --url http://127.0.0.1:8000 --model NAME \
        [--requests 64] [--prompt-len 128] [--max-tokens 128] [--json]
"""

import argparse
import json
import random
import statistics
import threading
import time
import urllib.request


def one(url, model, prompt, max_tokens, out, i, stream):
    body = {
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
        "temperature": 0, "stream": stream,
    }
    if stream:
        # OpenAI (and the server) refuse `stream_options` without `stream`.
        body["stream_options"] = {"include_usage": True}
    body = json.dumps(body).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    times, n = [], 0
    if not stream:
        with urllib.request.urlopen(req, timeout=600) as r:
            v = json.loads(r.read())
        out[i] = ([time.perf_counter() - t0], v["usage"]["completion_tokens"])
        return
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                n = chunk["usage"]["completion_tokens"]
            else:
                times.append(time.perf_counter() - t0)
    out[i] = (times, n)


def stats(v):
    if not v:
        return None
    return {"mean": statistics.mean(v), "p50": pct(v, 50), "p90": pct(v, 90), "p99": pct(v, 99)}


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p / 100 * len(v)))] if v else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-stream", action="store_true",
                    help="whole responses: measures the server without the client's per-chunk cost")
    a = ap.parse_args()
    rng = random.Random(0)
    prompts = [[rng.randrange(a.vocab) for _ in range(a.prompt_len)] for _ in range(a.requests)]
    out = [None] * a.requests
    t0 = time.perf_counter()
    th = [threading.Thread(target=one, args=(a.url, a.model, p, a.max_tokens, out, i, not a.no_stream))
          for i, p in enumerate(prompts)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    ttft = [1e3 * o[0][0] for o in out if o and o[0]]
    itl = [1e3 * (b - a_) for o in out if o for a_, b in zip(o[0], o[0][1:])]
    tokens = sum(o[1] for o in out if o)
    row = {
        "requests": a.requests, "prompt_len": a.prompt_len, "max_tokens": a.max_tokens,
        "wall_s": wall, "requests_per_s": a.requests / wall, "output_tokens_per_s": tokens / wall,
        "stream": not a.no_stream,
        # With --no-stream, the first "chunk" is the whole response: end-to-end latency.
        "ttft_ms": stats(ttft),
        "itl_ms": stats(itl),
    }
    print(json.dumps(row) if a.json else json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
