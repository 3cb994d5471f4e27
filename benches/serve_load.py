"""Bounded load test (docs/serve.md) of `yolo9 serve`: N clients each POST the example images M times in turn.

usage: python3 benches/serve_load.py HOST:PORT CLIENTS REQUESTS_PER_CLIENT IMAGE...
Prints requests/s, p50/p99 latency and the answer codes. The clients are threads spread over up to
os.cpu_count() processes (env SERVE_LOAD_PROCS overrides), each with its own keep-alive connection,
so that one interpreter's lock does not cap the rate the service is measured at. Standard library
only."""
import http.client
import multiprocessing as mp
import os
import sys
import threading
import time


def client(host, port, k, m, imgs, lat, codes, lock):
    c = http.client.HTTPConnection(host, port, timeout=60)
    for i in range(m):
        body = imgs[(k + i) % len(imgs)]
        t = time.perf_counter()
        c.request('POST', '/v1/detect', body=body, headers={'Content-Type': 'image/jpeg'})
        r = c.getresponse()
        r.read()
        d = time.perf_counter() - t
        with lock:
            lat.append(d)
            codes[r.status] = codes.get(r.status, 0) + 1


def process(host, port, ks, m, paths, start, out):
    imgs = [open(p, 'rb').read() for p in paths]
    lat, codes, lock = [], {}, threading.Lock()
    th = [threading.Thread(target=client, args=(host, port, k, m, imgs, lat, codes, lock)) for k in ks]
    start.wait()
    [t.start() for t in th]
    [t.join() for t in th]
    out.put((lat, codes))


def main():
    host, port = sys.argv[1].split(':')
    n, m, paths = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    procs = max(1, min(n, int(os.environ.get('SERVE_LOAD_PROCS', os.cpu_count() or 1))))
    start, out = mp.Event(), mp.Queue()
    ps = [mp.Process(target=process, args=(host, int(port), list(range(p, n, procs)), m, paths, start, out))
          for p in range(procs)]
    [p.start() for p in ps]
    time.sleep(0.2 + 0.01 * procs)  # the processes import and read the images before the clock starts
    t0 = time.perf_counter()
    start.set()
    lat, codes = [], {}
    for _ in ps:
        l, c = out.get()
        lat += l
        for k, v in c.items():
            codes[k] = codes.get(k, 0) + v
    wall = time.perf_counter() - t0
    [p.join() for p in ps]
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1e3
    print(f"requests {len(lat)} clients {n} procs {procs} wall_s {wall:.2f} req_per_s {len(lat)/wall:.1f} "
          f"p50_ms {q(0.5):.1f} p99_ms {q(0.99):.1f} codes {codes}")


if __name__ == '__main__':
    main()
