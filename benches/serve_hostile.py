"""Hostile-client run against a local `yolo9 serve` (issue 36): while ordinary clients POST an image in a
loop, attackers send slowloris headers and bodies, hold 2,000 idle connections, POST decompression-bomb
PNGs in parallel, ask for oversized `img`, and disconnect right after sending a request. Measures the
ordinary clients' latency (p50/p99 per 5 s window and overall) and serve's RSS (from /proc) throughout;
at the end sends SIGTERM and measures how long the process takes to exit. Loopback only, bounded in time.

With --format-bombs (issue 51) attackers also POST a PNG whose ICC profile inflates to 1 GiB, a 16-bit
RGBA PNG and a progressive JPEG of 100 scans (needs Pillow), each near the largest the decode budget
admits; and after the run an abandonment phase POSTs the progressive JPEG, hangs up 0.3 s later and
measures how long serve's CPU keeps burning (from /proc/PID/stat), against the same decode answered.

usage: python3 benches/serve_hostile.py HOST:PORT SERVE_PID IMAGE [SECONDS=60] [IDLE=2000]
Start serve first, e.g. `yolo9 serve --device cpu --img 320 --addr 127.0.0.1:8090 --drain-s 10 &`.
Prints one line per window and a summary line; exits 1 when p99 > 1 s, RSS > budget + 300 MB
(budget from --budget-mb, default 2048) or the exit after SIGTERM took longer than --drain-s + 2 s."""
import argparse, http.client, os, resource, signal, socket, struct, sys, threading, time, zlib

ap = argparse.ArgumentParser()
ap.add_argument('addr'); ap.add_argument('pid', type=int); ap.add_argument('image')
ap.add_argument('seconds', type=float, nargs='?', default=60.0); ap.add_argument('idle', type=int, nargs='?', default=2000)
ap.add_argument('--budget-mb', type=int, default=2048); ap.add_argument('--drain-s', type=float, default=10.0)
ap.add_argument('--clients', type=int, default=2)
ap.add_argument('--bomb-rate', type=float, default=5.0, help='bombs per second per bomb thread (0: as fast as possible)')
ap.add_argument('--term-at', type=float, default=0.0, help='send SIGTERM this many seconds into the run, attackers still active (0: after the run)')
ap.add_argument('--no-attack', action='store_true', help='ordinary clients only (the baseline)')
ap.add_argument('--bomb-side', type=int, default=18900, help='pixels per side the bomb PNG declares')
ap.add_argument('--format-bombs', action='store_true', help='ICC, 16-bit and progressive-JPEG bombs, and the abandonment phase')
a = ap.parse_args()
host, port = a.addr.split(':'); port = int(port)
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, a.idle + 1024)), hard))
img = open(a.image, 'rb').read()
stop = threading.Event()


def bomb_png(side=18900):
    """A PNG declaring side x side RGB pixels, all zero: about 1 MB on the wire, ~1 GB decoded."""
    def chunk(t, d):
        return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d) & 0xffffffff)
    z = zlib.compressobj(9); row = b'\0' * (1 + 3 * side); body = b''.join(z.compress(row) for _ in range(side)) + z.flush()
    return b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', side, side, 8, 2, 0, 0, 0)) + chunk(b'IDAT', body) + chunk(b'IEND', b'')


BOMB = bomb_png(a.bomb_side)


def png(w, h, depth, ctype, channels, extra=b''):
    """A PNG of zero pixels (`depth` bits, colour type `ctype`), `extra` chunks before IDAT."""
    def chunk(t, d):
        return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d) & 0xffffffff)
    z = zlib.compressobj(9); row = b'\0' * (1 + channels * depth // 8 * w)
    body = b''.join(z.compress(row) for _ in range(h)) + z.flush()
    return (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, depth, ctype, 0, 0, 0)) + extra
            + chunk(b'IDAT', body) + chunk(b'IEND', b''))


def icc_bomb():
    """A 64x64 PNG whose iCCP profile inflates to 1 GiB (about 1 MB on the wire)."""
    z = zlib.compressobj(9); mb = b'\0' * (1 << 20)
    prof = b''.join(z.compress(mb) for _ in range(1024)) + z.flush()
    d = b'bomb\0\0' + prof
    iccp = struct.pack('>I', len(d)) + b'iCCP' + d + struct.pack('>I', zlib.crc32(b'iCCP' + d) & 0xffffffff)
    return png(64, 64, 8, 2, 3, iccp)


def progressive_bomb(side=6000, scans=100):
    """A side x side progressive JPEG (Pillow) whose last scan is repeated up to `scans` scans,
    within the decoding-bomb guard's limits (100 scans, 4e9 scans x pixels)."""
    import io
    from PIL import Image
    rnd = os.urandom(side * side // 64)
    small = Image.frombytes('L', (side // 8, side // 8), rnd).convert('RGB')
    b = io.BytesIO(); small.resize((side, side), Image.NEAREST).save(b, 'JPEG', quality=90, progressive=True)
    d = b.getvalue()
    sos = [i for i in range(len(d) - 1) if d[i] == 0xff and d[i + 1] == 0xda]
    last = d[sos[-1]:-2]
    return d[:-2] + last * (scans - len(sos)) + d[-2:]


FORMAT_BOMBS = {}
if a.format_bombs:
    FORMAT_BOMBS['icc'] = icc_bomb()
    # 16-bit RGBA: 8 B/px native + 3 B/px RGB; sized to about a third of the budget.
    side16 = int((a.budget_mb * (1 << 20) / 3 / 11) ** 0.5)
    FORMAT_BOMBS['png16'] = png(side16, side16, 16, 6, 4)
    FORMAT_BOMBS['progressive'] = progressive_bomb()
    print('format bombs (bytes): ' + ', '.join(f'{k} {len(v)}' for k, v in FORMAT_BOMBS.items()), flush=True)
end = time.time() + a.seconds
lock = threading.Lock()
lat = []          # (time, seconds, status) of ordinary requests
att = {}          # attacker outcome counts
rss = []          # (time, MB)


def count(k):
    with lock: att[k] = att.get(k, 0) + 1


def ordinary(k):
    while time.time() < end:
        t = time.perf_counter(); t_wall = time.time()
        try:
            c = http.client.HTTPConnection(host, port, timeout=30)
            c.request('POST', '/v1/detect', body=img, headers={'Content-Type': 'image/jpeg'})
            r = c.getresponse(); r.read(); st = r.status; c.close()
        except Exception as e:
            st = type(e).__name__
        with lock: lat.append((t_wall, time.perf_counter() - t, st))
        time.sleep(0.05)


def connect():
    s = socket.create_connection((host, port), timeout=5); s.settimeout(5); return s


def slowloris_header():
    while time.time() < end:
        try:
            s = connect(); s.sendall(b'POST /v1/detect HTTP/1.1\r\nHost: x\r\n')
            while time.time() < end:
                s.sendall(b'X-a: b\r\n'); time.sleep(1)
        except Exception:
            count('slow_header_cut')
        time.sleep(0.2)


def slowloris_body():
    while time.time() < end:
        try:
            s = connect(); s.sendall(b'POST /v1/detect HTTP/1.1\r\nHost: x\r\nContent-Length: 30000000\r\n\r\n')
            while time.time() < end:
                s.sendall(b'\0' * 16); time.sleep(1)
        except Exception:
            count('slow_body_cut')
        time.sleep(0.2)


def idle_pool(n):
    socks = []
    while time.time() < end:
        socks = [s for s in socks if s.fileno() != -1]
        while len(socks) < n and time.time() < end:
            try: socks.append(socket.create_connection((host, port), timeout=2))
            except Exception: count('idle_connect_failed'); break
        # Reap the ones the service closed, to open them again.
        for s in socks:
            s.setblocking(False)
            try:
                if s.recv(1) == b'': s.close(); count('idle_closed')
            except BlockingIOError: pass
            except Exception: s.close(); count('idle_closed')
        time.sleep(0.5)
    for s in socks: s.close()


def post_raw(body, path='/v1/detect', read=True):
    s = connect()
    s.sendall(f'POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n'.encode() + body)
    if not read: s.close(); return 'sent'
    s.settimeout(60); data = b''
    while True:
        d = s.recv(65536)
        if not d: break
        data += d
    s.close(); return data.split(b' ', 2)[1].decode() if data else 'closed'


def bombs():
    while time.time() < end:
        try: count('bomb_' + post_raw(BOMB))
        except Exception as e: count('bomb_' + type(e).__name__)
        if a.bomb_rate > 0: time.sleep(1 / a.bomb_rate)


def format_bomb(kind):
    while time.time() < end:
        try: count(f'{kind}_' + post_raw(FORMAT_BOMBS[kind]))
        except Exception as e: count(f'{kind}_' + type(e).__name__)
        time.sleep(0.2)


def cpu_s():
    f = open(f'/proc/{a.pid}/stat').read().rsplit(')', 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf('SC_CLK_TCK')


def abandonment():
    """Serve's CPU after a client hangs up on a slow decode: seconds until it goes idle."""
    body = FORMAT_BOMBS['progressive']
    t = time.perf_counter(); c0 = cpu_s()
    answered = post_raw(body)
    full_s, full_cpu = time.perf_counter() - t, cpu_s() - c0
    time.sleep(1)
    s = connect()
    s.sendall(f'POST /v1/detect HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n'.encode() + body)
    time.sleep(0.3); s.close(); hung_up = time.perf_counter()
    # Idle: under 10% of a core over 200 ms.
    prev_t, prev_c = time.perf_counter(), cpu_s()
    while time.perf_counter() - hung_up < 60:
        time.sleep(0.2)
        now_t, now_c = time.perf_counter(), cpu_s()
        if (now_c - prev_c) / (now_t - prev_t) < 0.1: break
        prev_t, prev_c = now_t, now_c
    # An upper bound: the end of the first idle window.
    return answered, full_s, full_cpu, now_t - hung_up


def oversized():
    while time.time() < end:
        try: count('img4096_' + post_raw(img, '/v1/detect?img=4096'))
        except Exception as e: count('img4096_' + type(e).__name__)
        time.sleep(0.2)


def early_disconnect():
    while time.time() < end:
        try: post_raw(img, read=False); count('early_disconnect')
        except Exception as e: count('early_' + type(e).__name__)
        time.sleep(0.05)


def sample_rss():
    while not stop.is_set():
        try:
            for l in open(f'/proc/{a.pid}/status'):
                if l.startswith('VmRSS:'):
                    with lock: rss.append((time.time(), int(l.split()[1]) / 1024))
        except FileNotFoundError:
            return
        time.sleep(0.25)


term_box = {}


def terminate():
    ts = time.perf_counter(); term_box['at'] = time.time(); os.kill(a.pid, signal.SIGTERM)
    while os.path.exists(f'/proc/{a.pid}') and time.perf_counter() - ts < a.drain_s + 30:
        try:
            if open(f'/proc/{a.pid}/status').read().find('State:\tZ') >= 0: break
        except FileNotFoundError: break
        time.sleep(0.02)
    term_box['took'] = time.perf_counter() - ts


def term_later():
    time.sleep(max(0.0, t0 + a.term_at - time.time())); terminate()


t0 = time.time()
threads = [threading.Thread(target=sample_rss, daemon=True)]
if a.term_at > 0: threads.append(threading.Thread(target=term_later, daemon=True))
threads += [threading.Thread(target=ordinary, args=(k,)) for k in range(a.clients)]
if not a.no_attack:
  threads += [threading.Thread(target=slowloris_header) for _ in range(50)]
  threads += [threading.Thread(target=slowloris_body) for _ in range(50)]
  threads += [threading.Thread(target=idle_pool, args=(a.idle,))]
  threads += [threading.Thread(target=bombs) for _ in range(4)]
  threads += [threading.Thread(target=oversized) for _ in range(2)]
  threads += [threading.Thread(target=early_disconnect) for _ in range(4)]
  threads += [threading.Thread(target=format_bomb, args=(k,)) for k in FORMAT_BOMBS]
for t in threads: t.start()
for t in threads: t.join() if not t.daemon else None
if a.term_at > 0:
    while 'took' not in term_box: time.sleep(0.1)
    lat = [x for x in lat if x[0] < term_box['at']]  # ordinary requests started before SIGTERM
q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(p * len(xs)))] if xs else float('nan')
fail = []
for w0 in range(0, int(a.seconds), 5):
    xs = [d for (t, d, s) in lat if t0 + w0 <= t < t0 + w0 + 5]
    rs = [m for (t, m) in rss if t0 + w0 <= t < t0 + w0 + 5]
    print(f'window {w0:3d}-{w0 + 5:3d}s: ordinary n={len(xs)} p50_ms={q(xs, .5) * 1e3:.0f} p99_ms={q(xs, .99) * 1e3:.0f} '
          f'rss_max_mb={max(rs) if rs else float("nan"):.0f}')
all_lat = [d for (_, d, _) in lat]; codes = {}
for (_, _, s) in lat: codes[s] = codes.get(s, 0) + 1
max_rss = max((m for _, m in rss), default=float('nan'))
abandon = None
if FORMAT_BOMBS and a.term_at <= 0:
    time.sleep(2)
    abandon = abandonment()
    print(f'abandonment: the progressive bomb answered {abandon[0]} in {abandon[1]:.2f} s ({abandon[2]:.2f} CPU s); '
          f'hung up after 0.3 s, serve idle within {abandon[3]:.2f} s')
# SIGTERM: time until the process is gone.
if a.term_at <= 0: terminate()
term = term_box['took']; stop.set()
print(f'ordinary requests {len(all_lat)} codes {codes} p50_ms {q(all_lat, .5) * 1e3:.0f} p99_ms {q(all_lat, .99) * 1e3:.0f} '
      f'max_ms {max(all_lat, default=0) * 1e3:.0f}')
print(f'attackers {dict(sorted(att.items()))}')
print(f'serve rss max_mb {max_rss:.0f} (budget {a.budget_mb} + 300) ; exit after SIGTERM {term:.2f} s (drain {a.drain_s} s)')
if q(all_lat, .99) > 1.0: fail.append('p99 over 1 s')
if any(s != 200 for s in codes): fail.append('ordinary requests not all 200')
if max_rss > a.budget_mb + 300: fail.append('RSS over budget + 300 MB')
if term > a.drain_s + 2: fail.append('SIGTERM exit slower than the drain time + 2 s')
if abandon and abandon[3] > 1.0: fail.append('an abandoned decode kept running over 1 s')
print('FAIL: ' + '; '.join(fail) if fail else 'PASS')
sys.exit(1 if fail else 0)
