"""Batches: from a list and from a JSON Lines file (streamed), their status, their
results across pages, their cancel; and the README's batch script, run as written."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentq_client import APIError, Client
from conftest import HOLD

README = Path(__file__).resolve().parents[1] / "README.md"


def test_a_batch_from_a_list_runs_and_reads_back_in_order(client: Client):
    items = [{"custom_id": f"item-{i}", "prompt": f"task {i}"} for i in range(5)]
    batch = client.submit_batch(items, max_running=2, metadata={"run": "list"})
    assert batch.total == 5 and batch.metadata == {"run": "list"}
    assert batch.max_running == 2
    # Read while it runs, a page of two at a time: the results come in request order.
    results = list(client.batch_results(batch.id, limit=2, timeout=120))
    assert [r.custom_id for r in results] == [f"item-{i}" for i in range(5)]
    assert [r.result for r in results] == [f"Done: task {i}" for i in range(5)]
    assert all(r.status == "completed" for r in results)
    done = client.wait_batch(batch.id, timeout=120)
    assert done.status == "completed" and done.counts.completed == 5
    assert done.finish_reasons == {"stop": 5}
    assert batch.id in [b.id for b in client.iter_batches(limit=1)]
    assert {s.batch_id for s in client.iter_sessions(batch_id=batch.id)} == {batch.id}


def test_a_batch_from_a_jsonl_file_is_streamed(client: Client, tmp_path):
    path = tmp_path / "batch.jsonl"
    with path.open("w") as f:
        for i in range(3):
            f.write(json.dumps({"custom_id": f"line-{i}", "prompt": f"line {i}"}) + "\n")
    batch = client.upload_batch(path, max_running=1, metadata={"run": "file"})
    assert batch.total == 3 and batch.metadata == {"run": "file"} and batch.max_running == 1
    got = [(r.custom_id, r.result) for r in client.batch_results(batch.id, timeout=120)]
    assert got == [(f"line-{i}", f"Done: line {i}") for i in range(3)]
    # From a generator too: never a list in memory.
    gen = client.upload_batch({"prompt": f"gen {i}"} for i in range(2))
    assert gen.total == 2


def test_a_bad_item_is_named(client: Client, tmp_path):
    with pytest.raises(APIError) as e:
        client.submit_batch([{"prompt": "fine"}, {"prompt": "bad", "mode": "sideways"}])
    assert e.value.field == "requests[1].mode"
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine"}\n{"prompt": "bad", "mode": "sideways"}\n')
    with pytest.raises(APIError) as e:
        client.upload_batch(path)
    assert e.value.field is not None and "mode" in e.value.field


def test_cancelling_a_batch(client: Client):
    batch = client.submit_batch([{"prompt": f"{HOLD} b{i}", "tools": ["write_file"],
                                  "sensitive_tools": ["write_file"]} for i in range(2)])
    cancelled = client.cancel_batch(batch.id)
    assert cancelled.status in ("cancelling", "cancelled")
    final = client.wait_batch(batch.id, timeout=120)
    assert final.status == "cancelled"
    results = list(client.batch_results(batch.id, timeout=60))
    assert [r.status for r in results] == ["cancelled", "cancelled"]


def readme_script() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    batch = [b for b in blocks if "submit_batch" in b]
    assert batch, "the README shows no batch script"
    return batch[0]


def test_the_readme_batch_script_runs_as_written(url, tmp_path):
    script = readme_script()
    assert len(script.strip().splitlines()) <= 12, "the README's script is meant to be short"
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=dict(os.environ),
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 3, out.stdout
    assert all(re.match(r"^q\d+ completed Done: ", line) for line in lines), out.stdout
