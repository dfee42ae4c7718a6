#!/usr/bin/env python3
"""Resident memory of a running server around big pushes (docs/benchmarks-history.md, "Memory under big pushes").

Usage: scripts/push-memory.py BASE_URL PID [--records 300000] [--concurrent 1] [--password admin]

Signs in as admin, sends CONCURRENT pushes of RECORDS small records each (about 77 bytes a record:
300,000 make a 23 MB body) at once, samples the server's VmRSS every 20 ms meanwhile, then waits
10 s and reads VmRSS again. Prints one JSON line: body size, statuses, baseline, peak and settled
RSS in MiB, and the Retry-After values of the answers that were not 200. Standard library only.
"""

import argparse
import json
import threading
import time
import urllib.error
import urllib.request
import uuid


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def call(base, path, body, token=None):
    """(status, body, Retry-After or None); status "reset" when the server closed the connection
    while the body was still being sent (a 503 of the body budget answered before reading it)."""
    req = urllib.request.Request(base + path, data=body, method="POST")
    req.add_header("content-type", "application/json")
    if token:
        req.add_header("authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=600) as res:
            return res.status, res.read(), res.headers.get("retry-after")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("retry-after")
    except (ConnectionError, urllib.error.URLError) as e:
        return "reset", str(e).encode(), None


def push_body(records):
    tid = str(uuid.uuid4())
    prefix = tid[:8]
    items = ",".join(
        '{"observation_id":"%s-%07d","form_type":"survey","data":{"n":%d}}'
        % (prefix, i, i)
        for i in range(records)
    )
    text = '{"client_id":"bench-%s","transmission_id":"%s","records":[%s]}' % (prefix, tid, items)
    return text.encode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("pid", type=int)
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--concurrent", type=int, default=1)
    ap.add_argument("--password", default="admin")
    args = ap.parse_args()

    status, raw, _ = call(args.base, "/auth/login",
                       json.dumps({"username": "admin", "password": args.password}).encode())
    assert status == 200, raw
    token = json.loads(raw)["token"]
    bodies = [push_body(args.records) for _ in range(args.concurrent)]
    time.sleep(2)
    baseline = rss_kib(args.pid)

    statuses = [None] * len(bodies)
    retry_after = [None] * len(bodies)
    elapsed = [None] * len(bodies)

    def send(i):
        t0 = time.time()
        statuses[i], _, retry_after[i] = call(args.base, "/sync/push", bodies[i], token)
        elapsed[i] = round(time.time() - t0, 2)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    peak = baseline
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        peak = max(peak, rss_kib(args.pid))
        time.sleep(0.02)
    time.sleep(10)
    settled = rss_kib(args.pid)
    mib = lambda kib: round(kib / 1024, 1)
    print(json.dumps({
        "body_mb": round(len(bodies[0]) / 1e6, 1),
        "concurrent": len(bodies),
        "statuses": statuses,
        "retry_after": sorted({r for s, r in zip(statuses, retry_after) if s != 200}, key=str),
        "seconds": elapsed,
        "baseline_mib": mib(baseline),
        "peak_mib": mib(peak),
        "after_10s_mib": mib(settled),
    }))


if __name__ == "__main__":
    main()
