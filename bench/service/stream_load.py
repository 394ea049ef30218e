#!/usr/bin/env python3
"""Streaming load on the daemon's OpenAI API for machines without Node (the GPU machine): N
concurrent clients, each sending R streamed chat requests one after another over plain HTTP
(Server-Sent Events read line by line, standard library only). Prints time to first token and
inter-token latency percentiles and the token rate as one JSON object; the SDK-based twin is
tests/service/openai/stream_load.mjs.

  stream_load.py BASE_URL MODEL [--key KEY] [--clients 64] [--requests 2] [--max-tokens 64]
"""
import argparse
import http.client
import json
import threading
import time
import urllib.parse


def percentile(values, q):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def one_request(url, key, model, client, request, max_tokens, out):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = json.dumps({
        "model": model,
        "messages": [{"role": "user", "content": f"Client {client} request {request}: tell me about experts."}],
        "max_tokens": max_tokens, "temperature": 1, "top_k": 20, "seed": client * 1000 + request,
        "stream": True, "stream_options": {"include_usage": True}})
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    t0 = time.perf_counter()
    conn.request("POST", u.path.rstrip("/") + "/chat/completions", body, headers)
    resp = conn.getresponse()
    if resp.status != 200:
        out["errors"].append(f"HTTP {resp.status}: {resp.read()[:200]!r}")
        return
    last = None
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if chunk.get("usage"):
            out["tokens"] += chunk["usage"]["completion_tokens"]
        choices = chunk.get("choices") or []
        if not choices or not choices[0].get("delta", {}).get("content"):
            continue
        now = time.perf_counter()
        if last is None:
            out["ttft"].append(now - t0)
        else:
            out["itl"].append(now - last)
        last = now
    conn.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base_url")
    ap.add_argument("model")
    ap.add_argument("--key", default="")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args()
    out = {"ttft": [], "itl": [], "tokens": 0, "errors": []}
    lock = threading.Lock()

    def client(c):
        local = {"ttft": [], "itl": [], "tokens": 0, "errors": []}
        for r in range(a.requests):
            try:
                one_request(a.base_url, a.key, a.model, c, r, a.max_tokens, local)
            except Exception as e:  # a failed request is reported, the others go on
                local["errors"].append(repr(e))
        with lock:
            for k in ("ttft", "itl", "errors"):
                out[k] += local[k]
            out["tokens"] += local["tokens"]

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ms = lambda v: None if v is None else round(v * 1e3, 2)
    print(json.dumps({
        "clients": a.clients, "requests": a.clients * a.requests, "wall_s": round(wall, 3),
        "completion_tokens": out["tokens"], "tokens_per_s": round(out["tokens"] / wall, 1),
        "ttft_ms_p50": ms(percentile(out["ttft"], 0.5)), "ttft_ms_p99": ms(percentile(out["ttft"], 0.99)),
        "itl_ms_p50": ms(percentile(out["itl"], 0.5)), "itl_ms_p99": ms(percentile(out["itl"], 0.99)),
        "errors": out["errors"][:5], "error_count": len(out["errors"])}))


if __name__ == "__main__":
    main()
