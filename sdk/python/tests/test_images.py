"""`Sandbox.create(image=...)` and `AsyncSandbox.create(image=...)` start the named image: the
built-in `minimal` lacks the default image's extras; an unknown name is refused by name."""

from __future__ import annotations

import asyncio

import pytest

from branchbox import AsyncSandbox, NotFoundError, Sandbox


def test_create_starts_the_named_image(service):
    with Sandbox.create(image="minimal", timeout=120, **service.sdk()) as small, \
            Sandbox.create(timeout=120, **service.sdk()) as full:
        assert small.get_info().image != full.get_info().image
        assert small.commands.run("python3 -c 'print(6 * 7)'").stdout.strip() == "42"
        assert small.commands.run("command -v git || echo none").stdout.strip() == "none"
        assert full.commands.run("command -v git").stdout.strip().endswith("/git")


def test_async_create_starts_the_named_image(service):
    async def run() -> str:
        async with await AsyncSandbox.create(image="minimal", timeout=120, **service.sdk()) as s:
            return (await s.commands.run("command -v git || echo none")).stdout.strip()

    assert asyncio.run(run()) == "none"


def test_an_unknown_image_is_refused_by_name(service):
    with pytest.raises(NotFoundError) as e:
        Sandbox.create(image="no-such-image", **service.sdk())
    assert "no-such-image" in str(e.value) and "image import" in str(e.value), str(e.value)
