//! Files: upload, download and listing; a large binary file; paths the agent refuses.

use branchbox_conformance::{Ctx, Shell};

pub fn put_get_and_ls_round_trip(c: &Ctx) {
    let s = c.create(&[]);
    s.put_text("/root/note.txt", "first line\nsecond line\n");
    assert_eq!(s.sh("cat /root/note.txt"), "first line\nsecond line\n");
    let got = c.run(&["files", "get", &s.id, "/root/note.txt", "-"]);
    assert!(got.status.success());
    assert_eq!(got.stdout, b"first line\nsecond line\n");
    let listing = c.json(&["files", "ls", &s.id, "/root"]);
    let note = listing
        .as_array()
        .and_then(|l| l.iter().find(|e| e["name"] == "note.txt"))
        .unwrap_or_else(|| panic!("note.txt is not listed: {listing}"));
    assert_eq!((note["kind"].as_str(), note["size"].as_u64()), (Some("file"), Some(23)), "{note}");
    // An upload replaces the file whole.
    s.put_text("/root/note.txt", "short");
    assert_eq!(s.sh("cat /root/note.txt"), "short");
}

pub fn a_big_binary_file_round_trips_byte_exact(c: &Ctx) {
    let s = c.create(&[]);
    let dir = tempfile::tempdir().expect("temporary directory");
    let (src, back) = (dir.path().join("in.bin"), dir.path().join("out.bin"));
    // 8 MiB of every byte value in no simple order: many protocol chunks, no run a codec could
    // shortcut.
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    std::fs::write(&src, &data).expect("write the source file");
    c.ok(&["files", "put", &s.id, src.to_str().expect("utf-8 path"), "/root/blob.bin"]);
    assert_eq!(s.sh("stat -c %s /root/blob.bin").trim(), (8 << 20).to_string());
    c.ok(&["files", "get", &s.id, "/root/blob.bin", back.to_str().expect("utf-8 path")]);
    assert!(std::fs::read(&back).expect("read the download") == data, "the file changed on the way");
}

pub fn refused_paths_get_clear_errors_and_write_nothing(c: &Ctx) {
    let s = c.create(&[]);
    let dir = tempfile::tempdir().expect("temporary directory");
    let local = dir.path().join("out");
    let local = local.to_str().expect("utf-8 path");
    let err = c.fails(&["files", "put", &s.id, "/etc/hostname", "relative/path"]);
    assert!(err.contains("relative/path") && err.contains("absolute path"), "{err}");
    let err = c.fails(&["files", "get", &s.id, "relative", local]);
    assert!(err.contains("absolute path"), "{err}");
    let err = c.fails(&["files", "get", &s.id, "/root", local]);
    assert!(err.contains("is a directory"), "{err}");
    let err = c.fails(&["files", "get", &s.id, "/no/such/file", local]);
    assert!(err.contains("/no/such/file") && err.contains("No such file"), "{err}");
    let err = c.fails(&["files", "put", &s.id, "/etc/hostname", "/no/such/dir/file"]);
    assert!(err.contains("/no/such/dir/file"), "{err}");
    let err = c.fails(&["files", "ls", &s.id, "/no/such/dir"]);
    assert!(err.contains("/no/such/dir"), "{err}");
    assert_eq!(std::fs::read_dir(dir.path()).expect("list").count(), 0, "a refused download left a file");
    assert!(!s.sh_output("test -e /no/such/dir").status.success(), "a refused upload made its directory");
}
