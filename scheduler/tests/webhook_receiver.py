"""A webhook receiver for scheduler/tests/webhooks.rs: verifies every delivery with the
`standardwebhooks` package (the Standard Webhooks reference library) and behaves by path.

Usage: python webhook_receiver.py DIR. It binds 127.0.0.1:0 and writes its port to
DIR/port; it reads DIR/secrets.json ({path: [whsec_...]}) at every request, and logs one
JSON line per request to DIR/log.jsonl (before answering): the path, `webhook-id`, which
secrets verified it, the status it answers and the body.

Paths: /script answers a message's first attempt 500, its second by hanging past any
sane timeout, later ones 200 if a secret verifies it (else 401); /ok 200 if verified
(else 401); /fail 500; /redirect 302 to /ok; /slow 200 with a body that trickles;
/huge 200 with 64 MiB of body.
"""

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks import Webhook

DIR = sys.argv[1]
LOCK = threading.Lock()
ATTEMPTS = {}


def secrets_for(path):
    try:
        with open(os.path.join(DIR, "secrets.json")) as f:
            return json.load(f).get(path, [])
    except (OSError, ValueError):
        return []


def log(entry):
    with LOCK:
        with open(os.path.join(DIR, "log.jsonl"), "a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        n = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(n)
        headers = {k.lower(): v for k, v in self.headers.items()}
        verified = []
        for s in secrets_for(self.path):
            try:
                Webhook(s).verify(body, headers)
                verified.append(True)
            except Exception:
                verified.append(False)
        mid = headers.get("webhook-id", "")
        with LOCK:
            ATTEMPTS[mid] = ATTEMPTS.get(mid, 0) + 1
            attempt = ATTEMPTS[mid]
        ok = 200 if any(verified) else 401
        status = {
            "/script": 500 if attempt == 1 else (0 if attempt == 2 else ok),
            "/ok": ok,
            "/fail": 500,
            "/redirect": 302,
            "/slow": 200,
            "/huge": 200,
        }.get(self.path, 404)
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        log({"path": self.path, "id": mid, "attempt": attempt, "verified": verified,
             "status": status, "body": payload})
        if status == 0:
            # Hang: the sender's timeout must end the attempt.
            time.sleep(60)
            return
        self.send_response(status)
        if self.path == "/redirect":
            self.send_header("location", "/ok")
            self.send_header("content-length", "0")
            self.end_headers()
            return
        if self.path == "/slow":
            self.send_header("content-length", str(10**9))
            self.end_headers()
            for _ in range(600):
                try:
                    self.wfile.write(b"x")
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(0.1)
            return
        if self.path == "/huge":
            self.send_header("content-length", str(64 << 20))
            self.end_headers()
            chunk = b"y" * (1 << 20)
            try:
                for _ in range(64):
                    self.wfile.write(chunk)
            except OSError:
                pass
            return
        self.send_header("content-length", "0")
        self.end_headers()


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
tmp = os.path.join(DIR, "port.tmp")
with open(tmp, "w") as f:
    f.write(str(server.server_address[1]))
os.rename(tmp, os.path.join(DIR, "port"))
server.serve_forever()
