//! The metadata store keeps SQLite's locks intact while one process opens it again and again
//! beside other processes: the way `meta.db` lost its first page was this process dropping its
//! own locks by closing a descriptor of the live database (docs/architecture.md, "Metadata
//! store").

use branchbox_model::{BackendKind, Limits, Sandbox, SandboxId, SandboxState};
use branchbox_store::{file, Store};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// SQLite's lock bytes on a database file (its `os_unix.c`): the pending byte at 1 GiB,
/// then the reserved byte, then 510 shared bytes.
const SHARED_FIRST: i64 = 0x4000_0000 + 2;
const SHARED_SIZE: i64 = 510;

fn sandbox() -> Sandbox {
    Sandbox {
        id: SandboxId::generate(),
        backend: BackendKind::Gvisor,
        image: "img-0123456789abcdef".into(),
        state: SandboxState::Running,
        created_ms: 1,
        parent_snapshot: None,
        limits: Limits::default(),
        history: false,
    }
}

/// Whether some process (this one included: an open-file-description lock conflicts with
/// this process's own POSIX locks) holds a lock in SQLite's shared range of the file that
/// `probe` is open on. The probe stays open: closing it would drop this process's locks.
fn shared_range_locked(probe: &std::fs::File) -> bool {
    // SAFETY: a zeroed flock is a valid value; F_OFD_GETLK only fills it in.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = SHARED_FIRST;
    fl.l_len = SHARED_SIZE;
    // SAFETY: fcntl(F_OFD_GETLK) on an open descriptor with a valid flock.
    let r = unsafe { libc::fcntl(probe.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
    assert_eq!(r, 0, "F_OFD_GETLK: {}", std::io::Error::last_os_error());
    fl.l_type != libc::F_UNLCK as libc::c_short
}

#[test]
fn opening_the_store_again_keeps_the_locks_of_open_connections() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.db");
    let first = Store::open(&path).unwrap();
    first.insert_sandbox(&sandbox()).unwrap();
    let probe = std::fs::File::open(&path).unwrap();
    assert!(shared_range_locked(&probe), "an open WAL connection holds a shared lock");
    let second = Store::open(&path).unwrap();
    assert!(
        shared_range_locked(&probe),
        "opening the store again dropped the first connection's lock: another process may now delete the write-ahead log under it"
    );
    second.insert_sandbox(&sandbox()).unwrap();
    assert_eq!(first.sandboxes().unwrap().len(), 2);
}

/// The other process's part in the test below: opens the store, reads it and closes it, over
/// and over, for `BRANCHBOX_LOCKS_CHILD_S` seconds. A close that believes it is the last
/// connection checkpoints and deletes the write-ahead log, which is harmless only when the
/// locks of every other connection are intact.
#[test]
fn child_reader_role() {
    let (Ok(path), Ok(secs)) =
        (std::env::var("BRANCHBOX_LOCKS_CHILD_DB"), std::env::var("BRANCHBOX_LOCKS_CHILD_S"))
    else {
        return;
    };
    let end = Instant::now() + Duration::from_secs(secs.parse().unwrap());
    while Instant::now() < end {
        let s = Store::open(Path::new(&path)).unwrap();
        s.sandboxes().unwrap();
    }
}

#[test]
fn every_write_survives_reopens_spawns_and_other_processes() {
    let dir = tempfile::tempdir().unwrap();
    let meta = dir.path().join("meta.db");
    let other = dir.path().join("service.db");
    // A long-lived connection, as branchboxd's engine and service databases have.
    let held = Store::open(&meta).unwrap();
    let held_other = Store::open(&other).unwrap();
    let readers: Vec<_> = [&meta, &other]
        .iter()
        .map(|db| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "child_reader_role", "--test-threads=1"])
                .env("BRANCHBOX_LOCKS_CHILD_DB", db)
                .env("BRANCHBOX_LOCKS_CHILD_S", "4")
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let written = std::thread::scope(|s| {
        // Processes started and reaped beside the databases, as forks spawn shims and runsc.
        s.spawn(|| {
            let end = Instant::now() + Duration::from_secs(4);
            while Instant::now() < end {
                Command::new("true").stdin(Stdio::piped()).stdout(Stdio::piped()).status().unwrap();
            }
        });
        let writers: Vec<_> = [&meta, &other]
            .into_iter()
            .map(|db| {
                s.spawn(move || {
                    let end = Instant::now() + Duration::from_secs(4);
                    let mut n = 0;
                    // One connection per request, as the service opens the engine per request.
                    while Instant::now() < end {
                        Store::open(db).unwrap().insert_sandbox(&sandbox()).unwrap();
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        writers.into_iter().map(|w| w.join().unwrap()).collect::<Vec<usize>>()
    });
    for mut r in readers {
        assert!(r.wait().unwrap().success(), "the reader process failed");
    }
    held.insert_sandbox(&sandbox()).unwrap();
    held_other.insert_sandbox(&sandbox()).unwrap();
    drop((held, held_other));
    for (db, n) in [(&meta, written[0]), (&other, written[1])] {
        let head = std::fs::read(db).unwrap();
        assert!(head.starts_with(b"SQLite format 3\0"), "{} lost its header", db.display());
        file::check(db).unwrap();
        assert_eq!(
            Store::open(db).unwrap().sandboxes().unwrap().len(),
            n + 1,
            "{} lost writes",
            db.display()
        );
    }
}
