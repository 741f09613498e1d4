"""An MCP server over stdio for agentq's fault tests: each tool misbehaves one way.

Usage: fault_server.py LOG_FILE. Every request and notification it receives is
appended to LOG_FILE as a JSON line, so a test can see what reached the server
(`notifications/cancelled`, how many calls of a tool ran).
"""

import json
import os
import sys
import threading
import time

LOG = sys.argv[1]
out_lock = threading.Lock()
cancelled = {}
extra_tools = []


def log(entry):
    with open(LOG, "a") as f:
        f.write(json.dumps(entry) + "\n")


def send(msg):
    data = json.dumps(msg) + "\n"
    with out_lock:
        sys.stdout.write(data)
        sys.stdout.flush()


def text(t, is_error=False):
    return {"content": [{"type": "text", "text": t}], "isError": is_error}


def schema(props, required=()):
    return {
        "type": "object",
        "properties": props,
        "required": list(required),
        "additionalProperties": False,
    }


TOOLS = [
    {"name": "echo", "description": "Echo `text`.",
     "inputSchema": schema({"text": {"type": "string", "maxLength": 100}}, ["text"]),
     "annotations": {"readOnlyHint": True}},
    {"name": "env", "description": "The server's environment.",
     "inputSchema": schema({}), "annotations": {"readOnlyHint": True}},
    {"name": "crash", "description": "Exit in the middle of the call.",
     "inputSchema": schema({})},
    {"name": "hang", "description": "Stop answering anything.",
     "inputSchema": schema({})},
    {"name": "slow", "description": "Answer only when cancelled (never).",
     "inputSchema": schema({}), "annotations": {"idempotentHint": True}},
    {"name": "hold", "description": "Like slow, with no annotation (unsafe).",
     "inputSchema": schema({})},
    {"name": "big", "description": "Answer `bytes` bytes of text.",
     "inputSchema": schema({"bytes": {"type": "integer", "minimum": 0}}, ["bytes"]),
     "annotations": {"readOnlyHint": True}},
    {"name": "liar", "description": "Refuses what its schema allows.",
     "inputSchema": schema({"n": {"type": "integer"}}, ["n"])},
    {"name": "garbage", "description": "Answers something that is not a result.",
     "inputSchema": schema({})},
    {"name": "grow", "description": "Add a tool `added` and say the list changed.",
     "inputSchema": schema({})},
    {"name": "delete_all", "description": "Destructive.",
     "inputSchema": schema({}), "annotations": {"destructiveHint": True}},
]


def call(msg_id, name, args):
    if name == "echo":
        return text(args.get("text", ""))
    if name == "env":
        return text(json.dumps(dict(os.environ)))
    if name == "crash":
        os._exit(3)
    if name == "hang":
        with out_lock:
            time.sleep(3600)
    if name in ("slow", "hold"):
        ev = cancelled.setdefault(msg_id, threading.Event())
        ev.wait(3600)
        return None
    if name == "big":
        return text("x" * int(args["bytes"]))
    if name == "liar":
        send({"jsonrpc": "2.0", "id": msg_id,
              "error": {"code": -32602, "message": "n must be odd, and it never is"}})
        return None
    if name == "garbage":
        with out_lock:
            sys.stdout.write("this is not JSON\n")
            sys.stdout.flush()
        send({"jsonrpc": "2.0", "id": msg_id, "result": {"content": "not a list"}})
        return None
    if name == "grow":
        if not extra_tools:
            extra_tools.append({"name": "added", "description": "Added later.",
                                "inputSchema": schema({}),
                                "annotations": {"readOnlyHint": True}})
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        return text("grown")
    if name in ("added", "delete_all"):
        return text(name + " ran")
    send({"jsonrpc": "2.0", "id": msg_id,
          "error": {"code": -32602, "message": "unknown tool " + name}})
    return None


def handle_call(msg):
    params = msg.get("params", {})
    result = call(msg["id"], params.get("name"), params.get("arguments") or {})
    if result is not None:
        send({"jsonrpc": "2.0", "id": msg["id"], "result": result})


def main():
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        method = msg.get("method")
        log({"method": method, "id": msg.get("id"), "params": msg.get("params")})
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": msg["id"], "result": {
                "protocolVersion": msg["params"]["protocolVersion"],
                "capabilities": {"tools": {"listChanged": True}},
                "serverInfo": {"name": "fault", "version": "1"}}})
        elif method == "tools/list":
            send({"jsonrpc": "2.0", "id": msg["id"],
                  "result": {"tools": TOOLS + extra_tools}})
        elif method == "tools/call":
            threading.Thread(target=handle_call, args=(msg,), daemon=True).start()
        elif method == "ping":
            send({"jsonrpc": "2.0", "id": msg["id"], "result": {}})
        elif method == "notifications/cancelled":
            rid = msg.get("params", {}).get("requestId")
            cancelled.setdefault(rid, threading.Event()).set()
        elif "id" in msg and method is not None:
            send({"jsonrpc": "2.0", "id": msg["id"],
                  "error": {"code": -32601, "message": "no method " + method}})


main()
