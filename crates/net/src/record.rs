//! The policy record beside a networked sandbox and its snapshots (`network.json`): written
//! when the sandbox is created or its policy changes, copied into snapshots, read by each
//! query of the sandbox's DNS forwarder and by restores, so children get the network their
//! snapshot was taken with. Both backends keep it the same way.

use crate::{Egress, Error, Result};
use std::io::Read;
use std::path::Path;

/// The policy record in a sandbox's or a snapshot's directory.
pub const POLICY_FILE: &str = "network.json";
/// The largest policy record read back (an allow-list of 256 entries is a few KiB).
const MAX_POLICY_BYTES: u64 = 64 * 1024;

fn io(path: &Path, source: std::io::Error) -> Error {
    Error::Io { path: path.to_path_buf(), source }
}

/// Records `egress` as the policy of the sandbox or snapshot in `dir` (replaced whole, by
/// rename, so a reader never sees half of it).
pub fn record(dir: &Path, egress: &Egress) -> Result<()> {
    let path = dir.join(POLICY_FILE);
    let tmp = dir.join(format!("{POLICY_FILE}.tmp"));
    let text = serde_json::to_vec(egress).map_err(|e| Error::Invalid(e.to_string()))?;
    std::fs::write(&tmp, text).map_err(|e| io(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| io(&path, e))
}

/// The policy recorded in `dir`, or `None` for a sandbox or snapshot without a network. A
/// record that is not a policy (or is over 64 KiB) is an [`Error::Invalid`] naming the file.
pub fn recorded(dir: &Path) -> Result<Option<Egress>> {
    let path = dir.join(POLICY_FILE);
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(&path, e)),
    };
    let mut bytes = Vec::new();
    file.take(MAX_POLICY_BYTES).read_to_end(&mut bytes).map_err(|e| io(&path, e))?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| Error::Invalid(format!("{} is not a network policy ({e})", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AllowList;

    #[test]
    fn a_policy_comes_back_as_recorded_and_a_bad_record_is_named() {
        let dir = tempfile::tempdir().unwrap();
        assert!(recorded(dir.path()).unwrap().is_none());
        let list = Egress::AllowList(AllowList::parse(&["203.0.113.0/24", "pypi.org"]).unwrap());
        record(dir.path(), &list).unwrap();
        assert_eq!(recorded(dir.path()).unwrap(), Some(list));
        std::fs::write(dir.path().join(POLICY_FILE), b"{\"mode\": 7}").unwrap();
        let e = recorded(dir.path()).unwrap_err().to_string();
        assert!(e.contains("network.json is not a network policy"), "{e}");
        std::fs::write(dir.path().join(POLICY_FILE), vec![b' '; 70 * 1024]).unwrap();
        assert!(recorded(dir.path()).is_err(), "an oversized record was read");
    }
}
