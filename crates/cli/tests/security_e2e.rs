//! The command line against a hostile sandbox and a hostile local user: private files under a
//! permissive umask, an impostor on the service's port, planted symlinks and endless devices in
//! downloads, and guest-chosen names with terminal escapes.

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).permissions().mode() & 0o777
}

/// `cmd` with umask 000, as a careless shell or service manager would run it.
fn umask_000(cmd: &mut Command) -> &mut Command {
    // SAFETY: umask is async-signal-safe and has no preconditions.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0);
            Ok(())
        })
    }
}

/// A `branchbox` command for `data` that finds its service only through `<data>/service`.
fn bb_alone(data: &Path) -> Command {
    let mut c = bb_in(data);
    c.env_remove("BRANCHBOX_URL").env_remove("BRANCHBOX_TOKEN").env_remove("BRANCHBOX_NO_SERVICE");
    c
}

#[test]
fn the_data_directory_and_database_are_private_even_under_umask_000() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let out = umask_000(bb_alone(&data).arg("ls")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for dir in ["", "sandboxes", "snapshots", "runsc"] {
        assert_eq!(mode(&data.join(dir)), 0o700, "{dir}/");
    }
    assert_eq!(mode(&data.join("meta.db")), 0o600);
    // SQLite removes the -wal and -shm files when the last connection closes; any left are private.
    for file in ["meta.db-wal", "meta.db-shm"] {
        if data.join(file).exists() {
            assert_eq!(mode(&data.join(file)), 0o600, "{file}");
        }
    }
}

#[test]
fn doctor_reports_a_data_directory_others_can_read() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = bb_alone(&data).arg("doctor").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("run `chmod 700 {}`", data.display())), "{text}");
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700)).unwrap();
    let out = bb_alone(&data).arg("doctor").output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("chmod"));
}

/// A plain TCP listener that answers every request `200 []` and keeps all it was sent.
fn impostor() -> (String, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            kept.lock().unwrap().extend_from_slice(&buf);
            let _ = conn.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n[]",
            );
        }
    });
    (addr, seen)
}

fn service_dir(data: &Path, url: &str, token: &str) -> PathBuf {
    let service = data.join("service");
    std::fs::create_dir_all(&service).unwrap();
    std::fs::write(service.join("url"), format!("{url}\n")).unwrap();
    std::fs::write(service.join("token"), format!("{token}\n")).unwrap();
    std::fs::set_permissions(service.join("token"), std::fs::Permissions::from_mode(0o600)).unwrap();
    service
}

#[test]
fn the_cli_refuses_an_impostor_on_the_service_port() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let token = "bbx_impostor_test_secret_0123456789abcdef";
    let (addr, seen) = impostor();
    service_dir(&data, &format!("http://{addr}"), token);
    let out = bb_alone(&data).arg("ls").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let sent = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
    assert!(!sent.contains(token), "the token went to the impostor:\n{sent}");
    assert!(sent.contains("/v1/auth/challenge"), "the CLI did not check the service:\n{sent}");
    assert!(!out.status.success(), "the CLI went on as if the impostor were the service");
    assert!(stderr.contains("did not prove it is the branchbox service"), "{stderr}");
}

#[test]
fn the_cli_uses_a_real_service_after_it_proves_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let daemon = Daemon::start(&data, &[("BRANCHBOX_RUNSC", "/nonexistent/runsc")]);
    let out = bb_alone(&data).arg("ls").output().unwrap();
    let audit = bb_alone(&data).args(["kill", "sbx-0123456789abcdef"]).output().unwrap();
    drop(daemon);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The kill went to the service (its message names it), not to the engine.
    assert!(
        String::from_utf8_lossy(&audit.stderr).contains("HTTP 404"),
        "{}",
        String::from_utf8_lossy(&audit.stderr)
    );
}

#[test]
fn sockets_and_checkpoint_images_are_private_even_under_umask_000() {
    let data = private_dir("modes").join("data");
    let created = umask_000(bb_in(&data).args(["create", "--backend", "gvisor"])).output().unwrap();
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    let s = Sandbox(String::from_utf8_lossy(&created.stdout).trim().to_string(), data.clone());
    let snap = umask_000(bb_in(&data).args(["snapshot", &s.0])).output().unwrap();
    assert!(snap.status.success(), "{}", String::from_utf8_lossy(&snap.stderr));
    let snap = String::from_utf8_lossy(&snap.stdout).trim().to_string();
    let sandbox_dir = data.join("sandboxes").join(&s.0);
    assert_eq!(mode(&data), 0o700);
    assert_eq!(mode(&sandbox_dir), 0o700);
    assert_eq!(mode(&sandbox_dir.join("agent.sock")), 0o600, "agent.sock");
    let image = data.join("snapshots").join(&snap).join("checkpoint");
    assert_eq!(mode(&image), 0o700);
    assert_eq!(mode(&image.join("checkpoint.img")), 0o600, "checkpoint.img");
    for f in std::fs::read_dir(&image).unwrap() {
        let f = f.unwrap();
        if f.file_type().unwrap().is_file() {
            assert_eq!(mode(&f.path()) & 0o077, 0, "{}", f.path().display());
        }
    }
}

#[test]
fn a_planted_symlink_cannot_redirect_a_download() {
    let s = Sandbox::new();
    put_text(&s, "/tmp/payload", "bytes the guest chose");
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    // Where `files get ... out.txt` used to write before renaming, and the target itself.
    std::os::unix::fs::symlink(&victim, dir.path().join("out.branchbox-part")).unwrap();
    std::os::unix::fs::symlink(&victim, dir.path().join("link.txt")).unwrap();
    for target in ["out.txt", "link.txt"] {
        let local = dir.path().join(target);
        ok_in(&s.1, &["files", "get", &s.0, "/tmp/payload", local.to_str().unwrap()]);
        assert_eq!(std::fs::read_to_string(&local).unwrap(), "bytes the guest chose");
        assert!(std::fs::symlink_metadata(&local).unwrap().file_type().is_file(), "{target}");
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
}

#[test]
fn endless_devices_are_not_downloaded() {
    let s = Sandbox::new();
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("zero");
    let out = run_in(&s.1, &["files", "get", &s.0, "/dev/zero", local.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a regular file"));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the download left a file behind");
    let out = run_in(&s.1, &["files", "get", &s.0, "/dev/zero", "-"]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
}

#[test]
fn guest_chosen_names_are_printed_with_escapes_escaped() {
    let s = Sandbox::new();
    s.sh("mkdir -p /tmp/cc && touch \"/tmp/cc/$(printf '\\033[31mred\\033]0;owned\\007')\"");
    let listing = ok_in(&s.1, &["files", "ls", &s.0, "/tmp/cc"]);
    assert!(!listing.bytes().any(|b| b == 0x1b || b == 0x07), "raw escapes printed: {listing:?}");
    assert!(listing.contains("\\x1b[31mred\\x1b]0;owned\\x07"), "{listing:?}");
    let out = run_in(&s.1, &["exec", &s.0, "-s", "--", "printf '\\033[2J'; exit 3"]);
    // A command's own output is passed through untouched: it is what the user asked for.
    assert_eq!(out.stdout, b"\x1b[2J");
}
