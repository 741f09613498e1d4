"""A reverse proxy in front of the agentq API that injects the faults the clients must
survive, for their test suites (stdlib only). The mode is the path's first segment; the
rest of the path goes to the API as it is:

- `/throttle/...`: every other request is refused, 429 and 503 in turn, with
  `Retry-After: 1`. A request that comes back before that second has passed is counted
  as `early` (and refused again).
- `/always429/...`: every request is refused with 429 and `Retry-After: 0`.
- `/drop/...`: an event stream is cut after two events, in the middle of the third
  (its first lines sent, not its end), at every connection.
- `/__stats`: what was done, as JSON; `POST /__reset` zeroes it.

Usage: python fault_proxy.py UPSTREAM_URL; it prints `listening on http://127.0.0.1:PORT`.
"""

import http.client
import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

EVENTS_PER_CONNECTION = 2
HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
       "proxy-connection", "host", "content-length"}

lock = threading.Lock()
stats = {"requests": 0, "throttled": 0, "early": 0, "refused": 0, "cuts": 0}
not_before = [0.0]


class Proxy(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    upstream: tuple = ("127.0.0.1", 80)

    def log_message(self, *args):
        pass

    def body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("content-length") or 0)
        return self.rfile.read(n) if n else b""

    def answer(self, status: int, body: dict, headers=()):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def refuse(self, status: int, retry_after: str):
        self.answer(status, {"error": {"code": "rate_limited" if status == 429 else
                                       "unavailable", "message": "injected by the proxy",
                                       "field": None}}, [("retry-after", retry_after)])

    def handle_any(self):
        data = self.body()
        if self.path == "/__stats":
            with lock:
                return self.answer(200, dict(stats))
        if self.path == "/__reset":
            with lock:
                for k in stats:
                    stats[k] = 0
                not_before[0] = 0.0
            return self.answer(200, {})
        mode, _, rest = self.path.lstrip("/").partition("/")
        path = "/" + rest
        with lock:
            stats["requests"] += 1
            if mode == "always429":
                stats["refused"] += 1
                refuse = (429, "0")
            elif mode == "throttle":
                now = time.monotonic()
                if now < not_before[0]:
                    stats["early"] += 1
                    refuse = (429, "1")
                elif stats["requests"] % 2 == 1:
                    status = 429 if stats["throttled"] % 2 == 0 else 503
                    stats["throttled"] += 1
                    not_before[0] = now + 1.0
                    refuse = (status, "1")
                else:
                    refuse = None
            elif mode == "drop":
                refuse = None
            else:
                return self.answer(404, {"error": {"code": "not_found", "message":
                                                   f"no proxy mode {mode!r}", "field": None}})
        if refuse:
            return self.refuse(*refuse)
        self.forward(path, data, cut=(mode == "drop"))

    def forward(self, path: str, data: bytes, cut: bool):
        conn = http.client.HTTPConnection(*self.upstream, timeout=120)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        conn.request(self.command, path, body=data or None, headers=headers)
        resp = conn.getresponse()
        sse = resp.getheader("content-type", "").startswith("text/event-stream")
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in HOP:
                self.send_header(k, v)
        if not sse:
            payload = resp.read()
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            conn.close()
            return
        self.end_headers()
        self.wfile.flush()
        sent, has_id = 0, False
        while True:
            line = resp.readline()
            if not line:
                break
            blank = line in (b"\n", b"\r\n")
            if cut and sent >= EVENTS_PER_CONNECTION and blank and has_id:
                # The next event's first lines went out; its end never does.
                with lock:
                    stats["cuts"] += 1
                break
            self.wfile.write(line)
            self.wfile.flush()
            if line.startswith(b"id:"):
                has_id = True
            if blank:
                if has_id:
                    sent += 1
                has_id = False
        conn.close()
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = handle_any


def main():
    up = urlsplit(sys.argv[1])
    Proxy.upstream = (up.hostname, up.port or 80)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    server.daemon_threads = True
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", file=sys.stderr,
          flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
