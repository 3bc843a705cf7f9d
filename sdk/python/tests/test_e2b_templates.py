"""E2B's template builder (`e2b.Template`: build, build_in_background, get_build_status) on
branchbox's template engine (issue 28): the pinned `e2b` package, configured only as an E2B
user would, building on real gVisor sandboxes, and `Sandbox.create(name)` starting from what it
built. Builds cost seconds each here, so each test builds as little as it shows."""

from __future__ import annotations

import http.client
import io
import tarfile
import time
import urllib.parse
import uuid

import httpx
import pytest

from test_e2b_fixes import e2b_env  # noqa: F401  (the fixture)

e2b = pytest.importorskip("e2b", reason="the e2b package is not installed (pip install -r sdk/python/requirements-test.txt)")


@pytest.fixture
def names(service):
    """Template names for one test; the templates built under them are removed afterwards."""
    made = []

    def name(what: str) -> str:
        made.append(f"e2bt-{what}-{uuid.uuid4().hex[:8]}")
        return made[-1]

    yield name
    with service.client() as c:
        for n in made:
            c.delete(f"/v1/templates/{n}")


def test_a_template_built_with_e2bs_builder_starts_sandboxes_from_it(e2b_env, names, tmp_path):  # noqa: F811
    (tmp_path / "hello.txt").write_text("copied by the e2b builder\n")
    (tmp_path / "conf" / "sub").mkdir(parents=True)
    (tmp_path / "conf" / "a.ini").write_text("a = 1\n")
    (tmp_path / "conf" / "sub" / "b.ini").write_text("b = 2\n")
    name = names("full")
    template = (
        e2b.Template(file_context_path=str(tmp_path))
        .from_base_image()
        .run_cmd("echo built > /built.txt && echo the-run-step-says-hi")
        .copy("hello.txt", "/srv/app/")
        .copy("conf", "/etc/app/")
        .set_envs({"GREETING": "hi from the template"})
        .set_workdir("/srv/app")
        .set_start_cmd("touch /tmp/started; exec sleep 600", e2b.wait_for_file("/tmp/started"))
    )
    logs = []
    info = e2b.Template.build(template, name, on_build_logs=logs.append)
    assert info.template_id == name and info.name == name
    messages = [entry.message for entry in logs]
    assert any("the-run-step-says-hi" in m for m in messages), messages
    assert any(f"template {name} is ready" in m for m in messages), messages
    assert e2b.Template.exists(name) is True
    # Built again unchanged, every step (the COPY too, uploaded again) comes from the cache.
    again = []
    e2b.Template.build(template, name, on_build_logs=again.append)
    steps = [e.message for e in again if e.message.startswith("step ") and "/" in e.message.split()[1]]
    assert len(steps) == 8 and all(m.endswith("(cached)") for m in steps), steps
    assert e2b.Template.exists(name + "-none") is False
    s = e2b.Sandbox.create(name, timeout=120)
    try:
        assert s.files.read("/srv/app/hello.txt") == "copied by the e2b builder\n"
        assert s.files.read("/etc/app/sub/b.ini") == "b = 2\n"  # a directory's contents
        out = s.commands.run("pwd; echo $GREETING; cat /built.txt").stdout.splitlines()
        assert out == ["/srv/app", "hi from the template", "built"], out
        # The start command was running when the build's last snapshot was taken, so it is
        # running in every sandbox made from the template.
        assert "sleep 600" in s.commands.run("ps -eo args").stdout
    finally:
        s.kill()


def test_a_refused_step_fails_the_build_naming_it(e2b_env, names, tmp_path):  # noqa: F811
    (tmp_path / "a.txt").write_text("a")
    registry = e2b.Template().from_image("python:3.12").run_cmd("true")
    with pytest.raises(e2b.BuildException, match=r'fromImage "python:3\.12".*registries'):
        e2b.Template.build(registry, names("registry"))
    moded = (
        e2b.Template(file_context_path=str(tmp_path))
        .from_base_image()
        .run_cmd("true")
        .copy("a.txt", "/srv/", mode=0o755)
    )
    with pytest.raises(e2b.BuildException, match=r"step 2 \(COPY\): a mode"):
        e2b.Template.build(moded, names("mode"))
    forced = e2b.Template().from_base_image().skip_cache().run_cmd("true")
    with pytest.raises(e2b.BuildException, match=r"step 1 \(RUN\): force"):
        e2b.Template.build(forced, names("force"))


def test_a_failing_run_step_reports_its_output(e2b_env, names):  # noqa: F811
    name = names("fails")
    template = e2b.Template().from_base_image().run_cmd("echo about to fail; echo oops-on-stderr >&2; exit 3")
    info = e2b.Template.build_in_background(template, name)
    deadline = time.monotonic() + 120
    while True:
        st = e2b.Template.get_build_status(info, logs_offset=0)
        if st.status.value in ("ready", "error") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert st.status.value == "error", st
    assert st.reason.step == "1", st.reason
    assert "exited with code 3" in st.reason.message and "oops-on-stderr" in st.reason.message, st.reason
    assert any("about to fail" in e.message for e in st.log_entries), st.log_entries
    # The blocking build raises the SDK's build error with the step's output.
    with pytest.raises(e2b.BuildException, match=r"(?s)exited with code 3.*oops-on-stderr"):
        e2b.Template.build(template, name)


def test_cpu_count_and_memory_mb_are_the_limits_of_the_templates_sandboxes(e2b_env, names):  # noqa: F811
    name = names("limits")
    template = e2b.Template().from_base_image().run_cmd("echo limited > /limited.txt")
    e2b.Template.build(template, name, cpu_count=1, memory_mb=512)
    s = e2b.Sandbox.create(name, timeout=120)
    try:
        info = s.get_info()
        assert (info.cpu_count, info.memory_mb) == (1, 512), info
        assert s.commands.run("cat /limited.txt").stdout == "limited\n"
    finally:
        s.kill()
    # A sandbox of no template keeps the service's limits.
    plain = e2b.Sandbox.create(timeout=60)
    try:
        default_mb = plain.get_info().memory_mb
        assert default_mb != 512
    finally:
        plain.kill()
    # The same steps without limits take none of the limited build's cached steps.
    unlimited = names("unlimited")
    e2b.Template.build(template, unlimited)
    s = e2b.Sandbox.create(unlimited, timeout=60)
    try:
        assert s.get_info().memory_mb == default_mb
    finally:
        s.kill()
    # A template built on it keeps its limits: others are refused, naming them.
    on_it = e2b.Template().from_template(name).run_cmd("true")
    with pytest.raises(e2b.BuildException, match=r"built on template .* keeps its limits \(512 MiB, 1 CPUs"):
        e2b.Template.build(on_it, names("onit"), cpu_count=1, memory_mb=default_mb)
    # Out of the bounds of branchbox's own create: refused before anything is built.
    with pytest.raises(e2b.BuildException, match=r"400: memoryMB: memory limit 32 MiB is out of range"):
        e2b.Template.build(template, names("small"), memory_mb=32)
    with pytest.raises(e2b.BuildException, match=r"400: cpuCount: cpu limit 0 is out of range"):
        e2b.Template.build(template, names("nocpu"), cpu_count=0, memory_mb=512)
    with pytest.raises(e2b.BuildException, match=r"400: minFreeDiskMb is not served: gVisor keeps"):
        e2b.Template.build(template, names("disk"), cpu_count=1, memory_mb=512, min_free_disk_mb=1024)


def _tar(files: dict) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_uploads_with_a_wrong_hash_or_over_the_limit_are_refused(e2b_env, names):  # noqa: F811
    api = httpx.Client(base_url=f"{e2b_env.url}/e2b", headers={"X-API-Key": e2b_env.token}, timeout=60)
    name = names("hash")
    r = api.post("/v3/templates", json={"name": name})
    assert r.status_code == 202, r.text
    build = r.json()["buildID"]
    claimed = "ab" * 32
    link = api.get(f"/templates/{name}/files/{claimed}")
    assert link.status_code == 201 and link.json()["present"] is False, link.text
    url = link.json()["url"]
    # Not a tar: refused, and the link was used up.
    assert httpx.put(url, content=b"not a tar archive").status_code == 400
    assert httpx.put(url, content=_tar({"a.txt": b"a"})).status_code == 404
    url = api.get(f"/templates/{name}/files/{claimed}").json()["url"]
    assert httpx.put(url, content=_tar({"a.txt": b"other content than was hashed"})).status_code == 200
    assert api.get(f"/templates/{name}/files/{claimed}").json()["present"] is True
    steps = [{"type": "COPY", "args": ["a.txt", "/srv/", "", ""], "force": False, "filesHash": claimed}]
    r = api.post(f"/v2/templates/{name}/builds/{build}", json={"fromImage": "e2bdev/base", "steps": steps, "force": False})
    assert r.status_code == 400, r.text
    assert "step 1 (COPY a.txt)" in r.json()["message"] and "filesHash" in r.json()["message"], r.text
    # Over the size limit: refused from its declared length, before a byte of it is read.
    url = urllib.parse.urlsplit(api.get(f"/templates/{name}/files/{claimed}").json()["url"])
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.putrequest("PUT", url.path)
    conn.putheader("Content-Length", str(600 << 20))
    conn.endheaders()
    assert conn.getresponse().status == 413
    conn.close()
    # A hash that is not one: refused by the link route.
    assert api.get(f"/templates/{name}/files/not-a-hash").status_code == 400
