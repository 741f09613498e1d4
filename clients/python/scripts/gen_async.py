"""Write src/agentq_client/_async.py from _sync.py: the async client is the blocking one
with its I/O awaited, so the two never drift (tests/test_async_generated.py checks that
the committed file is this script's output). Run: python scripts/gen_async.py"""

import re
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "src" / "agentq_client"

REPLACEMENTS = [
    ('"""The blocking client: sends the `Call`s of `_core.Ops` with httpx."""',
     '"""The asyncio client: the blocking one\'s methods as coroutines, sending the same\n'
     '`Call`s of `_core.Ops`. Generated from `_sync.py` by scripts/gen_async.py: edit that\n'
     'file and run the script."""'),
    ("import time\n", "import time\n\nimport anyio\n"),
    ("from typing import Any, Iterable, Iterator,",
     "from typing import Any, AsyncIterator, Iterable, Iterator,"),
    ("class Client:", "class AsyncClient:"),
    ("httpx.BaseTransport", "httpx.AsyncBaseTransport"),
    ("httpx.Client(", "httpx.AsyncClient("),
    ("    def close(self) -> None:\n        self._http.close()",
     "    async def close(self) -> None:\n        await self._http.aclose()"),
    ('    def __enter__(self) -> "Client":', '    async def __aenter__(self) -> "AsyncClient":'),
    ("    def __exit__(self, *exc: Any) -> None:\n        self.close()",
     "    async def __aexit__(self, *exc: Any) -> None:\n        await self.close()"),
    ("time.sleep(", "await anyio.sleep("),
    ("self._http.request(", "await self._http.request("),
    ("with self._http.stream(", "async with self._http.stream("),
    ("r.read()", "await r.aread()"),
    ("for line in r.iter_lines():", "async for line in r.aiter_lines():"),
    ("c.sync_stream(", "c.async_stream("),
    ("self._send(", "await self._send("),
    ("for _ in self.events(", "async for _ in self.events("),
    ("= self.get_session(", "= await self.get_session("),
    ("= self.get_batch(", "= await self.get_batch("),
    ("= self.list_sessions(", "= await self.list_sessions("),
    ("= self.list_batches(", "= await self.list_batches("),
    ("yield from page.sessions", "for s in page.sessions:\n                yield s"),
    ("yield from page.batches", "for b in page.batches:\n                yield b"),
    ("= self.list_deliveries(", "= await self.list_deliveries("),
    ("yield from page.deliveries", "for d in page.deliveries:\n                yield d"),
    ("yield from page.results", "for res in page.results:\n                yield res"),
]


def generate(src: str) -> str:
    out = src
    for old, new in REPLACEMENTS:
        if old not in out:
            raise SystemExit(f"gen_async: {old!r} no longer in _sync.py; update the script")
        out = out.replace(old, new)
    # An attribute of an answer is read once it has been awaited, not of the coroutine.
    out = re.sub(r"await (self\._send\(.*\))\.(\w+)$", r"(await \1).\2", out, flags=re.M)
    out = re.sub(r"\n    def (?!__init__)", "\n    async def ", out)
    out = re.sub(r"-> Iterator\[", "-> AsyncIterator[", out)
    return out


def main() -> int:
    text = generate((PKG / "_sync.py").read_text())
    (PKG / "_async.py").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
