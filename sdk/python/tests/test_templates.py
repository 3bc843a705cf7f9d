"""Templates through the service and the SDK: build with streamed progress, the step cache
reused (identical step snapshots), a failed step's error and log, `Sandbox.create(template=...)`
with the template's env and workdir, and delete."""

import pytest

from branchbox import BranchboxError, InvalidArgumentError, NotFoundError, Sandbox, Templates

STEPS = [
    {"run": "mkdir -p /srv/app && head -c8 /dev/urandom | od -An -tx1 > /srv/app/stamp"},
    {"file": "/srv/app/hello.py", "content": "import os\nprint('hello', os.environ['APP_MODE'])\n", "mode": "644"},
    {"env": {"APP_MODE": "sdk"}},
    {"workdir": "/srv/app"},
]


def test_build_reuses_the_cache_and_sandboxes_get_env_and_workdir(service):
    events = []
    first = Templates.build("sdk-web", STEPS, on_event=lambda name, data: events.append((name, data)), **service.sdk())
    assert first.state == "ready" and first.steps == 4
    steps = [d for n, d in events if n == "step"]
    assert [(d["index"], d["total"]) for d in steps] == [(i, 4) for i in range(5)]
    assert steps[1]["step"] == "run " + STEPS[0]["run"]
    assert not any(d["cached"] for d in steps[1:])
    assert [d["index"] for n, d in events if n == "step_done"] == list(range(5))
    again = Templates.build("sdk-web", STEPS, **service.sdk())
    assert again.step_snapshots() == first.step_snapshots()
    assert all(s["cached"] for s in again.record["steps"])
    assert again.snapshot == first.snapshot
    assert "sdk-web" in {t.name for t in Templates.list(**service.sdk())}
    with Sandbox.create(template="sdk-web", **service.sdk()) as s:
        r = s.commands.run("python3 hello.py; pwd")
        assert r.stdout == "hello sdk\n/srv/app\n"
    Templates.delete("sdk-web", **service.sdk())
    with pytest.raises(NotFoundError):
        Templates.get("sdk-web", **service.sdk())


def test_a_failed_step_names_itself_and_keeps_its_log(service):
    steps = [{"run": "echo fine"}, {"run": "echo sdk-boom; exit 4"}]
    with pytest.raises(BranchboxError) as e:
        Templates.build("sdk-bad", steps, **service.sdk())
    assert "step 2/2" in e.value.message and "code 4" in e.value.message
    info = Templates.get("sdk-bad", **service.sdk())
    assert (info.state, info.failed_step, info.exit_code) == ("failed", 2, 4)
    assert info.step_snapshots()[0] is not None
    assert "sdk-boom" in Templates.log("sdk-bad", **service.sdk())
    Templates.delete("sdk-bad", **service.sdk())


def test_uploads_of_service_host_paths_are_refused(service):
    with pytest.raises(InvalidArgumentError) as e:
        Templates.build("sdk-up", [{"upload": "/etc", "to": "/x"}], **service.sdk())
    assert "upload" in e.value.message
