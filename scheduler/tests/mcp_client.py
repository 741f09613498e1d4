"""An MCP client on the official Python SDK, run by tests/mcp.rs against a real scheduler.

It connects to `/mcp` over streamable HTTP with an API key, lists the tools, submits a
session with a file, waits for it to end, reads its result and two files of its workspace
(the one it came with and the one its agent wrote), makes one call with a bad argument,
and prints what it saw as one JSON object on stdout.

Usage: python mcp_client.py <url of /mcp> <api key> <prompt>
"""

import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def payload(result):
    """A tool result's JSON text, decoded; with whether it is an error."""
    text = "".join(c.text for c in result.content if getattr(c, "type", "") == "text")
    return bool(result.is_error), json.loads(text)


async def main(url, key, prompt):
    seen = {}
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {key}"})
    async with http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                seen["server"] = init.server_info.name
                tools = await session.list_tools()
                seen["tools"] = sorted(t.name for t in tools.tools)
                submit = next(t for t in tools.tools if t.name == "submit_session")
                seen["submit_required"] = submit.input_schema.get("required")

                err, sub = payload(await session.call_tool("submit_session", {
                    "prompt": prompt,
                    "tools": ["read_file", "write_file"],
                    "files": [{"path": "notes.txt", "content": "hello from python"}],
                }))
                seen["submit"] = {"is_error": err, **sub}
                sid = sub["id"]

                ended, waits = False, 0
                while not ended and waits < 10:
                    err, waited = payload(await session.call_tool(
                        "wait_session", {"session_id": sid, "timeout_secs": 20}))
                    assert not err, waited
                    ended, waits = waited["ended"], waits + 1
                seen["ended"] = ended

                err, got = payload(await session.call_tool("get_session", {"session_id": sid}))
                seen["status"] = got["status"]
                seen["result"] = got["result"]
                seen["usage"] = got["usage"]

                err, files = payload(await session.call_tool("list_files", {"session_id": sid}))
                seen["files"] = sorted(f["path"] for f in files["files"])
                for path in ["notes.txt", "out/summary.txt"]:
                    err, f = payload(await session.call_tool(
                        "read_file", {"session_id": sid, "path": path}))
                    seen[path] = {"is_error": err, **f}

                err, bad = payload(await session.call_tool("submit_session", {
                    "prompt": prompt, "temperature": 7,
                }))
                seen["bad"] = {"is_error": err, **bad}
    print(json.dumps(seen))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
