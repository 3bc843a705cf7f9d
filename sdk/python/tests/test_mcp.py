"""The MCP server through the official `mcp` Python client (PyPI, pinned): `branchbox mcp` over
stdio, and branchboxd's `/mcp` over streamable HTTP behind its token. Each lists the tools,
creates a sandbox, runs code, checkpoints and rolls back, forks, and checks the errors an agent
gets, on real sandboxes.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from conftest import Service, _binary

mcp = pytest.importorskip("mcp", reason="pip install -r sdk/python/requirements-test.txt")
from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client  # noqa: E402

TOOLS = {"create", "run", "read_file", "write_file", "fork", "checkpoint", "rollback", "lineage", "list", "kill"}
LIMIT = 300.0


def ok(r) -> dict:
    """A tool's structured answer; fails with its text when the tool reported an error."""
    assert not r.is_error, [c.text for c in r.content]
    return r.structured_content


def refused(r, *words: str) -> str:
    """A tool error whose text names every one of `words`."""
    assert r.is_error, r.structured_content
    text = " ".join(c.text for c in r.content)
    for w in words:
        assert w in text, text
    return text


async def exercise(session: ClientSession) -> None:
    await session.initialize()
    tools = {t.name: t for t in (await session.list_tools()).tools}
    assert TOOLS <= set(tools), sorted(tools)
    run_schema = tools["run"].input_schema
    assert {"sandbox_id", "command"} <= set(run_schema["properties"]) and run_schema.get("additionalProperties") is False
    sid = ok(await session.call_tool("create", {}))["sandbox_id"]
    made = [sid]
    try:
        r = ok(await session.call_tool("run", {"sandbox_id": sid,
                                               "command": "python3 -c 'print(6 * 7)' | tee /tmp/answer"}))
        assert (r["exit_code"], r["stdout"]) == (0, "42\n"), r
        cp = ok(await session.call_tool("checkpoint", {"sandbox_id": sid}))["snapshot_id"]
        ok(await session.call_tool("run", {"sandbox_id": sid, "command": "rm /tmp/answer"}))
        assert ok(await session.call_tool("rollback", {"sandbox_id": sid, "snapshot": cp}))["snapshot_id"] == cp
        back = ok(await session.call_tool("read_file", {"sandbox_id": sid, "path": "/tmp/answer"}))
        assert back["content"] == "42\n", back
        forked = ok(await session.call_tool("fork", {"sandbox_id": sid, "count": 2}))
        kids = [c["sandbox_id"] for c in forked["children"]]
        assert all(kids) and len(set(kids)) == 2, forked
        made += kids
        ok(await session.call_tool("write_file", {"sandbox_id": kids[0], "path": "/tmp/mine", "content": "first"}))
        own = ok(await session.call_tool("read_file", {"sandbox_id": kids[0], "path": "/tmp/mine"}))
        assert own["content"] == "first", own
        other = ok(await session.call_tool("run", {"sandbox_id": kids[1],
                                                   "command": "test ! -e /tmp/mine && cat /tmp/answer"}))
        assert (other["exit_code"], other["stdout"]) == (0, "42\n"), f"a child saw its sibling's write: {other}"
        listed = {s["sandbox_id"] for s in ok(await session.call_tool("list", {}))["sandboxes"]}
        assert set(made) <= listed
        # Errors an agent can act on: they name what was wrong and what to do.
        refused(await session.call_tool("run", {"sandbox_id": "sbx-0000000000000000", "command": "true"}),
                "not found")
        refused(await session.call_tool("fork", {"sandbox_id": sid, "count": 17}), "17")
        refused(await session.call_tool("run", {"sandbox_id": sid, "command": "true", "bogus": 1}), "bogus")
        refused(await session.call_tool("rollback", {"sandbox_id": sid, "snapshot": "no-such-checkpoint"}))
    finally:
        for s in made:
            await session.call_tool("kill", {"sandbox_id": s})


def test_mcp_over_stdio_with_the_official_client(workdir: Path) -> None:
    data = workdir / f"py-{os.getpid()}-mcp-stdio"
    cli = _binary().parent / "branchbox"
    env = {k: v for k, v in os.environ.items() if k not in ("BRANCHBOX_URL", "BRANCHBOX_TOKEN")}
    env.update(BRANCHBOX_NO_SERVICE="1")
    params = StdioServerParameters(command=str(cli), args=["--data-dir", str(data), "mcp"], env=env)

    async def main() -> None:
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await exercise(session)

    try:
        asyncio.run(asyncio.wait_for(main(), LIMIT))
    finally:
        subprocess.run([str(cli), "--data-dir", str(data), "gc"], capture_output=True, env=env)
        shutil.rmtree(data, ignore_errors=True)


def test_mcp_over_http_on_branchboxd_with_the_official_client(service: Service) -> None:
    url = service.url + "/mcp"
    # Without the token the service answers 401 before any MCP message is read.
    assert httpx.post(url, json={}).status_code == 401

    async def main() -> None:
        client = create_mcp_http_client(headers=service.headers(), timeout=None)
        async with client:
            async with streamable_http_client(url, http_client=client) as streams:
                read, write = streams[0], streams[1]
                async with ClientSession(read, write) as session:
                    await exercise(session)

    asyncio.run(asyncio.wait_for(main(), LIMIT))
