"""Bounded load test (docs/serve.md) of `yolo9 serve`: N client threads each POST the example images M times in turn.
usage: python3 benches/serve_load.py HOST:PORT THREADS REQUESTS_PER_THREAD IMAGE...  Prints requests/s, p50/p99 latency, codes."""
import http.client, sys, threading, time
host, port = sys.argv[1].split(':'); n, m = int(sys.argv[2]), int(sys.argv[3]); imgs = [open(p, 'rb').read() for p in sys.argv[4:]]
lat, codes, lock = [], {}, threading.Lock()
def client(k):
    c = http.client.HTTPConnection(host, int(port), timeout=60)
    for i in range(m):
        body = imgs[(k + i) % len(imgs)]; t = time.perf_counter()
        c.request('POST', '/v1/detect', body=body, headers={'Content-Type': 'image/jpeg'}); r = c.getresponse(); r.read()
        d = time.perf_counter() - t
        with lock: lat.append(d); codes[r.status] = codes.get(r.status, 0) + 1
t0 = time.perf_counter(); th = [threading.Thread(target=client, args=(k,)) for k in range(n)]
[t.start() for t in th]; [t.join() for t in th]; wall = time.perf_counter() - t0
lat.sort(); q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1e3
print(f"requests {len(lat)} threads {n} wall_s {wall:.2f} req_per_s {len(lat)/wall:.1f} p50_ms {q(0.5):.1f} p99_ms {q(0.99):.1f} codes {codes}")
