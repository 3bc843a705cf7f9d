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

/// The guest's user and group names by id, for showing who owns a file.
#[derive(Debug, Default)]
pub struct Names {
    users: std::collections::HashMap<u32, String>,
    groups: std::collections::HashMap<u32, String>,
}

impl Names {
    /// Reads the guest's `/etc/passwd` and `/etc/group` (either may be missing: ids then show
    /// as numbers).
    pub fn read() -> Names {
        Names::parse(&read_db("/etc/passwd").unwrap_or_default(), &read_db("/etc/group").unwrap_or_default())
    }

    /// The names in the text of `passwd` and `group` (name first, id third in both).
    pub fn parse(passwd: &str, group: &str) -> Names {
        let ids = |text: &str| {
            let mut out = std::collections::HashMap::new();
            for f in text.lines().map(|l| l.split(':').collect::<Vec<_>>()).filter(|f| f.len() >= 3) {
                if let Ok(id) = f[2].parse::<u32>() {
                    out.entry(id).or_insert_with(|| f[0].to_string());
                }
            }
            out
        };
        Names { users: ids(passwd), groups: ids(group) }
    }

    /// The name of user `uid`, or the number.
    pub fn user(&self, uid: u32) -> String {
        self.users.get(&uid).cloned().unwrap_or_else(|| uid.to_string())
    }

    /// The name of group `gid`, or the number.
    pub fn group(&self, gid: u32) -> String {
        self.groups.get(&gid).cloned().unwrap_or_else(|| gid.to_string())
    }
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

/// The calling thread acting on files as an account: its effective uid and gid and its
/// supplementary groups are the account's until this is dropped, so the kernel checks every
/// path (a symlink the account planted included) as it would for the account's own commands,
/// and files it creates are the account's. Only the effective ids change (the real and saved
/// ones stay root's, so the thread can come back, and no process of the account may signal
/// the agent), and only on this thread: the raw syscalls are per-thread, unlike libc's
/// wrappers, which change every thread of the agent. (`setfsuid` would be the narrower tool,
/// but gVisor does not implement it.)
pub struct Acting {
    euid: u32,
    egid: u32,
    groups: Vec<libc::gid_t>,
}

/// What `setresuid`/`setresgid` take for "leave this id as it is".
const KEEP: libc::c_long = -1;

fn set_euid(id: u32) -> std::io::Result<()> {
    // SAFETY: setresuid takes integers and changes only this thread's credentials.
    check(unsafe { libc::syscall(libc::SYS_setresuid, KEEP, libc::c_long::from(id), KEEP) })
}

fn set_egid(id: u32) -> std::io::Result<()> {
    // SAFETY: setresgid takes integers and changes only this thread's credentials.
    check(unsafe { libc::syscall(libc::SYS_setresgid, KEEP, libc::c_long::from(id), KEEP) })
}

fn set_groups(groups: &[libc::gid_t]) -> std::io::Result<()> {
    // SAFETY: the pointer and length describe a live slice.
    check(unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) })
}

fn check(r: libc::c_long) -> std::io::Result<()> {
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// This thread's effective uid and gid, as the kernel has them.
fn effective() -> (u32, u32) {
    // SAFETY: geteuid and getegid take nothing and cannot fail.
    unsafe { (libc::syscall(libc::SYS_geteuid) as u32, libc::syscall(libc::SYS_getegid) as u32) }
}

fn thread_groups() -> std::io::Result<Vec<libc::gid_t>> {
    // SAFETY: a size of 0 asks for the count and writes nothing.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut groups = vec![0; n as usize];
    // SAFETY: `groups` has room for `n` ids.
    let n = unsafe { libc::getgroups(n, groups.as_mut_ptr()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    groups.truncate(n as usize);
    Ok(groups)
}

/// Makes the calling thread act on files as `account` until the guard is dropped. Refused
/// when the kernel does not switch the ids (whatever it did switch is put back), so a file
/// call never silently runs as root instead.
pub fn act_as(account: &Account) -> Result<Acting, Failure> {
    let refused = |what: String| {
        Failure::new(
            ErrorCode::PermissionDenied,
            format!("cannot act on files as {:?}: {what}", account.name),
        )
    };
    let (euid, egid) = effective();
    let groups = thread_groups().map_err(|e| refused(format!("getgroups: {e}")))?;
    // Dropped on any failure below, which puts back what was changed.
    let acting = Acting { euid, egid, groups };
    set_groups(&account.groups).map_err(|e| refused(format!("setgroups: {e}")))?;
    set_egid(account.gid).map_err(|e| refused(format!("setresgid: {e}")))?;
    // The uid last: the thread loses its capabilities with it.
    set_euid(account.uid).map_err(|e| refused(format!("setresuid: {e}")))?;
    if effective() != (account.uid, account.gid) {
        return Err(refused("the kernel did not switch the ids".into()));
    }
    Ok(acting)
}

impl Drop for Acting {
    fn drop(&mut self) {
        // The uid first: going back to root gives the thread its capabilities again, which
        // the gid and groups need. None can fail: the saved uid is still root.
        let _ = set_euid(self.euid);
        let _ = set_egid(self.egid);
        let _ = set_groups(&self.groups);
    }
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
