//! `branchbox mcp` end to end: a client speaking MCP's JSON-RPC over the server's stdin and
//! stdout drives real gVisor sandboxes through every tool, and gets errors it can act on; the
//! same tools over streamable HTTP on branchboxd, behind its token and its limits.

mod common;

use common::{bb_in, private_dir, with_bb_env, Daemon};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Stdio};

/// A running `branchbox mcp` and the sandboxes the test made through it (killed when dropped).
struct Mcp {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next: u64,
    dir: PathBuf,
    made: Vec<String>,
}

impl Mcp {
    fn start(name: &str) -> Mcp {
        let dir = private_dir(name);
        let mut child = with_bb_env(env!("CARGO_BIN_EXE_branchbox"), &dir)
            .arg("mcp")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Mcp { child, stdin, stdout, next: 1, dir, made: Vec::new() }
    }

    fn send(&mut self, msg: &Value) {
        writeln!(self.stdin, "{msg}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Sends a request and returns its response (notifications in between are skipped).
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let mut line = String::new();
            assert!(self.stdout.read_line(&mut line).unwrap() > 0, "the server closed its stdout");
            let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
            if v["id"] == json!(id) {
                return v;
            }
        }
    }

    /// Calls a tool: whether it failed, and its structured answer (or its text on failure).
    fn tool(&mut self, name: &str, args: Value) -> (bool, Value) {
        let r = self.request("tools/call", json!({"name": name, "arguments": args}));
        let result = &r["result"];
        assert!(result.is_object(), "tools/call {name} got no result: {r}");
        let failed = result["isError"] == json!(true);
        let text = result["content"][0]["text"].as_str().unwrap_or_default().to_string();
        (failed, if failed { Value::String(text) } else { result["structuredContent"].clone() })
    }

    fn ok(&mut self, name: &str, args: Value) -> Value {
        let (failed, v) = self.tool(name, args.clone());
        assert!(!failed, "{name} {args} failed: {v}");
        v
    }

    fn create(&mut self) -> String {
        let id = self.ok("create", json!({}))["sandbox_id"].as_str().unwrap().to_string();
        self.made.push(id.clone());
        id
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !self.made.is_empty() {
            let _ = bb_in(&self.dir).arg("kill").args(&self.made).output();
        }
    }
}

#[test]
fn an_mcp_client_creates_runs_forks_checkpoints_rolls_back_and_kills() {
    let mut m = Mcp::start("mcp");
    let init = m.request(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}),
    );
    assert_eq!(init["result"]["serverInfo"]["name"], "branchbox", "{init}");
    assert!(init["result"]["capabilities"]["tools"].is_object(), "{init}");
    m.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));

    let tools = m.request("tools/list", json!({}));
    let listed = tools["result"]["tools"].as_array().unwrap_or_else(|| panic!("{tools}"));
    let names: Vec<&str> = listed.iter().filter_map(|t| t["name"].as_str()).collect();
    for want in [
        "create",
        "run",
        "read_file",
        "write_file",
        "fork",
        "checkpoint",
        "rollback",
        "lineage",
        "list",
        "kill",
    ] {
        assert!(names.contains(&want), "{want} is not among {names:?}");
    }
    let run = listed.iter().find(|t| t["name"] == "run").unwrap();
    let schema = &run["inputSchema"];
    assert_eq!(schema["additionalProperties"], false, "{schema}");
    let mut required: Vec<&str> =
        schema["required"].as_array().unwrap().iter().filter_map(|r| r.as_str()).collect();
    required.sort_unstable();
    assert_eq!(required, ["command", "sandbox_id"], "{schema}");

    let s = m.create();
    let w = m.ok("write_file", json!({"sandbox_id": s, "path": "/root/plan.txt", "content": "step 1"}));
    assert_eq!(w["size"], 6, "{w}");
    let r = m.ok("run", json!({"sandbox_id": s, "command": "cat /root/plan.txt; echo oops >&2; exit 3"}));
    assert_eq!(
        (&r["exit_code"], &r["stdout"], &r["stderr"]),
        (&json!(3), &json!("step 1"), &json!("oops\n")),
        "{r}"
    );

    let cp = m.ok("checkpoint", json!({"sandbox_id": s}))["snapshot_id"].as_str().unwrap().to_string();
    m.ok("run", json!({"sandbox_id": s, "command": "rm /root/plan.txt"}));
    let (failed, why) = m.tool("read_file", json!({"sandbox_id": s, "path": "/root/plan.txt"}));
    assert!(failed, "the removed file was read: {why}");
    m.ok("rollback", json!({"sandbox_id": s, "snapshot": cp}));
    let f = m.ok("read_file", json!({"sandbox_id": s, "path": "/root/plan.txt"}));
    assert_eq!((&f["encoding"], &f["content"]), (&json!("utf-8"), &json!("step 1")), "{f}");

    m.ok("write_file", json!({"sandbox_id": s, "path": "/root/bin", "content": "AAEC/w==", "base64": true}));
    let f = m.ok("read_file", json!({"sandbox_id": s, "path": "/root/bin"}));
    assert_eq!(
        (&f["encoding"], &f["content"], &f["size"]),
        (&json!("base64"), &json!("AAEC/w=="), &json!(4)),
        "{f}"
    );

    let forked = m.ok("fork", json!({"sandbox_id": s, "count": 2}));
    let children: Vec<String> = forked["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["sandbox_id"].as_str().unwrap_or_else(|| panic!("a child failed: {forked}")).to_string())
        .collect();
    m.made.extend(children.iter().cloned());
    assert_eq!(children.len(), 2);
    m.ok("run", json!({"sandbox_id": children[0], "command": "echo mine > /root/plan.txt"}));
    let theirs = m.ok("read_file", json!({"sandbox_id": children[1], "path": "/root/plan.txt"}));
    assert_eq!(theirs["content"], "step 1", "a child saw its sibling's write: {theirs}");
    let tree = m.ok("lineage", json!({"sandbox_id": children[1]}));
    let text = tree.to_string();
    assert!(
        text.contains(&s)
            && text.contains(&children[0])
            && text.contains(forked["fork_point"].as_str().unwrap())
    );

    // Errors an agent can act on: each names what was wrong and what to do.
    let (failed, why) = m.tool("run", json!({"sandbox_id": "sbx-nothere", "command": "true"}));
    assert!(failed && why.as_str().unwrap().contains("`list`"), "{why}");
    let (failed, why) = m.tool("run", json!({"sandbox_id": s, "command": "true", "timeout_s": 0}));
    assert!(failed && why.as_str().unwrap().contains("1 to 3600"), "{why}");
    let (failed, why) = m.tool("fork", json!({"sandbox_id": s, "count": 17}));
    assert!(failed && why.as_str().unwrap().contains("1 to 16"), "{why}");
    let (failed, why) =
        m.tool("rollback", json!({"sandbox_id": children[0], "snapshot": "snap-0123456789abcdef"}));
    assert!(failed && !why.as_str().unwrap().is_empty(), "{why}");
    let bad = m.request("tools/call", json!({"name": "run", "arguments": {"sandbox_id": s, "cmd": "true"}}));
    assert!(
        bad["error"].is_object() || bad["result"]["isError"] == json!(true),
        "an unknown field was taken: {bad}"
    );

    for id in m.made.clone() {
        m.ok("kill", json!({"sandbox_id": id}));
    }
    let listing = m.ok("list", json!({}));
    for id in &m.made {
        assert!(!listing.to_string().contains(id.as_str()), "{id} is still listed: {listing}");
    }
    m.made.clear();
}

/// One JSON-RPC request to branchboxd's `/mcp`: the HTTP status and the parsed answer.
fn mcp_http(d: &Daemon, id: u64, method: &str, params: Value, token: bool) -> (u16, Value) {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
    let headers = "accept: application/json, text/event-stream\r\nmcp-protocol-version: 2025-06-18\r\n";
    let (code, text) = d.request_with("POST", "/mcp", headers, &body, token);
    (code, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

#[test]
fn the_tools_over_http_on_branchboxd_need_its_token_and_keep_its_limits() {
    let data = private_dir("mcp-http").join("data");
    let d = Daemon::start(&data, &[("BRANCHBOXD_MAX_SANDBOXES", "2")]);
    let init = json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}});
    let (code, v) = mcp_http(&d, 1, "initialize", init.clone(), false);
    assert_eq!(code, 401, "the MCP endpoint answered without the token: {v}");
    let (code, v) = mcp_http(&d, 1, "initialize", init, true);
    assert_eq!((code, &v["result"]["serverInfo"]["name"]), (200, &json!("branchbox")), "{v}");

    let call = |id: u64, name: &str, args: Value| -> (bool, Value) {
        let (code, v) = mcp_http(&d, id, "tools/call", json!({"name": name, "arguments": args}), true);
        assert_eq!(code, 200, "{v}");
        let r = &v["result"];
        let failed = r["isError"] == json!(true);
        (failed, if failed { r["content"][0]["text"].clone() } else { r["structuredContent"].clone() })
    };
    let (failed, made) = call(2, "create", json!({}));
    assert!(!failed, "{made}");
    let s = made["sandbox_id"].as_str().unwrap().to_string();
    let (failed, r) = call(3, "run", json!({"sandbox_id": s, "command": "echo over http"}));
    assert!(!failed && r["stdout"] == "over http\n", "{r}");

    // The service's own view: the sandbox is listed with the service's default timeout.
    let (code, info) = d.get(&format!("/v1/sandboxes/{s}"), true);
    assert_eq!(code, 200, "{info}");
    let info: Value = serde_json::from_str(&info).unwrap();
    assert!(info["expires_ms"].is_number(), "no timeout recorded: {info}");

    // The service's capacity limit applies (this one runs at most 2).
    let (failed, second) = call(4, "create", json!({}));
    let second = second["sandbox_id"].as_str().map(str::to_string);
    assert!(!failed, "{second:?}");
    let (failed, why) = call(5, "fork", json!({"sandbox_id": s, "count": 1}));
    assert!(failed && why.as_str().unwrap().contains("at most 2"), "a fork past the cap: {why}");
    for id in [Some(s.clone()), second].into_iter().flatten() {
        let (failed, why) = call(6, "kill", json!({"sandbox_id": id}));
        assert!(!failed, "{why}");
        assert_eq!(d.get(&format!("/v1/sandboxes/{id}"), true).0, 404, "{id} is still there");
    }
}
