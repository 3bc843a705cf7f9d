//! Running as an account of the image: its uid, gid, groups and home, read from the guest's
//! `/etc/passwd` and `/etc/group` (no NSS: the agent is static and the image may lack it).

use crate::Failure;
use branchbox_protocol::ErrorCode;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// Largest account database read; real ones are a few KiB.
const MAX_DB_BYTES: u64 = 1 << 20;
/// Most supplementary groups given to a process.
const MAX_GROUPS: usize = 64;

/// An account to run a command as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// Login name.
    pub name: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary groups (the primary one included).
    pub groups: Vec<u32>,
    /// Home directory.
    pub home: String,
}

fn read_db(path: &str) -> Result<String, Failure> {
    let mut text = String::new();
    std::fs::File::open(path).and_then(|f| f.take(MAX_DB_BYTES).read_to_string(&mut text)).map_err(|e| {
        Failure::new(ErrorCode::NotFound, format!("cannot read {path} to look up users: {e}"))
    })?;
    Ok(text)
}

/// Looks `name` up in the guest's account files.
pub fn lookup(name: &str) -> Result<Account, Failure> {
    let passwd = read_db("/etc/passwd")?;
    // A missing /etc/group only costs the supplementary groups.
    let group = read_db("/etc/group").unwrap_or_default();
    find(&passwd, &group, name)
}

/// The account `name` in the text of `passwd` and `group`.
pub fn find(passwd: &str, group: &str, name: &str) -> Result<Account, Failure> {
    let entry = passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() >= 7 && f[0] == name)
        .ok_or_else(|| {
            Failure::new(
                ErrorCode::NotFound,
                format!(
                    "no user {name:?} in the sandbox's /etc/passwd; pick an account the image has \
                     (e.g. \"root\"), or use the default image, which has \"user\""
                ),
            )
        })?;
    let num = |what: &str, v: &str| {
        v.parse::<u32>().map_err(|_| {
            Failure::new(
                ErrorCode::BadRequest,
                format!("/etc/passwd gives user {name:?} an invalid {what} {v:?}"),
            )
        })
    };
    let (uid, gid) = (num("uid", entry[2])?, num("gid", entry[3])?);
    let mut groups = vec![gid];
    for f in group.lines().map(|l| l.split(':').collect::<Vec<_>>()) {
        if f.len() < 4 || !f[3].split(',').any(|m| m == name) {
            continue;
        }
        if let Ok(g) = f[2].parse::<u32>() {
            if !groups.contains(&g) && groups.len() < MAX_GROUPS {
                groups.push(g);
            }
        }
    }
    let home = if entry[5].starts_with('/') { entry[5].to_string() } else { "/".to_string() };
    Ok(Account { name: name.to_string(), uid, gid, groups, home })
}

/// Makes `cmd` drop to `account` in the child, after the closures registered before (joining
/// the workloads' cgroup needs root).
pub fn run_as(cmd: &mut Command, account: &Account) {
    let (uid, gid, groups) = (account.uid, account.gid, account.groups.clone());
    let drop_to = move || {
        // SAFETY: setgroups, setgid and setuid are async-signal-safe; `groups` is a live
        // vector moved into the closure and its length is passed with it.
        unsafe {
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                || libc::setgid(gid) != 0
                || libc::setuid(uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    };
    // SAFETY: the closure makes only async-signal-safe calls.
    unsafe { cmd.pre_exec(drop_to) };
}

/// Changes the owner of `path` to `account` (not following a final symlink).
pub fn chown(path: &std::path::Path, account: &Account) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, Some(account.uid), Some(account.gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
                          broken:x:abc:0::/nowhere:/bin/sh\n\
                          user:x:1000:1000::/home/user:/bin/bash\n";
    const GROUP: &str = "root:x:0:\nsudo:x:27:user,other\nuser:x:1000:\nbad:x:zz:user\n";

    #[test]
    fn a_user_gets_its_ids_home_and_the_groups_that_list_it() {
        let a = find(PASSWD, GROUP, "user").unwrap();
        assert_eq!((a.uid, a.gid, a.home.as_str()), (1000, 1000, "/home/user"));
        assert_eq!(a.groups, vec![1000, 27]);
        let r = find(PASSWD, GROUP, "root").unwrap();
        assert_eq!((r.uid, r.gid, r.groups, r.home.as_str()), (0, 0, vec![0], "/root"));
    }

    #[test]
    fn a_missing_user_or_a_malformed_entry_is_refused_with_what_to_do() {
        let e = find(PASSWD, GROUP, "nobody").unwrap_err();
        assert!(e.message.contains("no user \"nobody\""), "{}", e.message);
        let e = find(PASSWD, GROUP, "broken").unwrap_err();
        assert!(e.message.contains("invalid uid"), "{}", e.message);
        // A prefix of a name is not the name.
        assert!(find(PASSWD, GROUP, "use").is_err());
    }
}
