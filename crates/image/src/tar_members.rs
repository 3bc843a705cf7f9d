//! Tar entries with their GNU long-name, long-link and PAX extension headers applied, each held
//! to a small budget before a byte of it is read.
//!
//! The `tar` crate reads those extension headers whole into memory, so a layer that claims a
//! gigabyte-long name costs gigabytes before any check of ours can run. Here the crate runs in
//! raw mode (every header is handed over unread) and this reader applies the extensions the way
//! the crate would: a GNU long name wins over a PAX `path`, which wins over the header's name
//! (the same for links), and PAX `uid`/`gid` replace the header's. What it cannot apply the same
//! way in raw mode is refused rather than read differently: a PAX `size` that disagrees with the
//! header's and GNU sparse entries (no image tool writes either below 8 GiB).

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Most bytes of one extension header's data: a GNU long name or long link, or one PAX record
/// set. Linux paths are at most 4 KiB; PAX sets hold a few records.
pub(crate) const MAX_EXTENSION: u64 = 64 << 10;

/// Longest prefix of a name from a tarball that an error message shows.
const SHOWN_BYTES: usize = 64;

/// Why a tar stream's entries could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MemberError {
    /// The stream itself failed (a bad checksum, a short read, a byte limit).
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// An extension header is over [`MAX_EXTENSION`]; its content is never read.
    #[error("a {what} header claims {size} bytes, over the limit of {MAX_EXTENSION}")]
    TooLarge {
        /// Which extension.
        what: &'static str,
        /// The size its header claims.
        size: u64,
    },
    /// Two extensions of one kind describe the same entry.
    #[error("two {0} headers describe the same entry")]
    Duplicate(&'static str),
    /// Extension headers at the end, describing no entry.
    #[error("extension headers at the end of the archive describe no entry")]
    Dangling,
    /// A PAX record set that does not parse, or a number in it that is not one.
    #[error("a PAX header is malformed ({0})")]
    BadPax(&'static str),
    /// A PAX `size` that differs from the header's (files of 8 GiB and more).
    #[error("a PAX size record of {pax} bytes differs from the header's {header}; entries of 8 GiB and more are not supported")]
    PaxSize {
        /// The PAX record's size.
        pax: u64,
        /// The header's size.
        header: u64,
    },
    /// A GNU sparse entry.
    #[error("GNU sparse entries are not supported; re-export the image without sparse files")]
    Sparse,
}

/// One entry with its extensions applied.
pub(crate) struct Member<'a, R: Read> {
    /// The entry; its header is the raw one (use [`Member::path`], [`Member::uid`] and the
    /// others for what extensions replace).
    pub(crate) entry: tar::Entry<'a, R>,
    path: Vec<u8>,
    link: Option<Vec<u8>>,
    uid: Option<u64>,
    gid: Option<u64>,
}

impl<R: Read> Member<'_, R> {
    /// The entry's path.
    pub(crate) fn path(&self) -> &Path {
        Path::new(OsStr::from_bytes(&self.path))
    }

    /// The target of a symlink or hard link, when it has one.
    pub(crate) fn link_name(&self) -> Option<&Path> {
        self.link.as_deref().filter(|l| !l.is_empty()).map(|l| Path::new(OsStr::from_bytes(l)))
    }

    /// The owner's uid.
    pub(crate) fn uid(&self) -> Option<u64> {
        self.uid.or_else(|| self.entry.header().uid().ok())
    }

    /// The owner's gid.
    pub(crate) fn gid(&self) -> Option<u64> {
        self.gid.or_else(|| self.entry.header().gid().ok())
    }
}

/// The entries of a tar stream, each with its extensions applied and bounded.
pub(crate) struct Members<'a, R: 'a + Read> {
    raw: tar::Entries<'a, R>,
    done: bool,
}

impl<'a, R: Read> Members<'a, R> {
    /// The entries of `archive`.
    pub(crate) fn new(archive: &'a mut tar::Archive<R>) -> Result<Members<'a, R>, MemberError> {
        Ok(Members { raw: archive.entries()?.raw(true), done: false })
    }

    fn next_member(&mut self) -> Result<Option<Member<'a, R>>, MemberError> {
        let (mut long_name, mut long_link, mut pax) = (None, None, None);
        loop {
            let Some(mut entry) = self.raw.next().transpose()? else {
                if long_name.is_some() || long_link.is_some() || pax.is_some() {
                    return Err(MemberError::Dangling);
                }
                return Ok(None);
            };
            let kind = entry.header().entry_type();
            let what = match kind {
                tar::EntryType::GNULongName => Some("GNU long name"),
                tar::EntryType::GNULongLink => Some("GNU long link"),
                tar::EntryType::XHeader => Some("PAX"),
                tar::EntryType::XGlobalHeader => Some("PAX global"),
                _ => None,
            };
            if let Some(what) = what {
                let size = entry.size();
                if size > MAX_EXTENSION {
                    return Err(MemberError::TooLarge { what, size });
                }
                // As the tar crate: only a ustar or GNU header is an extension; a global PAX
                // header is an entry of its own (which callers skip).
                let header = entry.header();
                let recognized = header.as_gnu().is_some() || header.as_ustar().is_some();
                let slot = match kind {
                    tar::EntryType::GNULongName => &mut long_name,
                    tar::EntryType::GNULongLink => &mut long_link,
                    tar::EntryType::XHeader => &mut pax,
                    _ => return Ok(Some(Member::new(entry, None, None, None)?)),
                };
                if !recognized {
                    return Ok(Some(Member::new(entry, None, None, None)?));
                }
                if slot.is_some() {
                    return Err(MemberError::Duplicate(what));
                }
                let mut data = Vec::new();
                (&mut entry).take(MAX_EXTENSION).read_to_end(&mut data)?;
                *slot = Some(data);
                continue;
            }
            if kind.is_gnu_sparse() {
                return Err(MemberError::Sparse);
            }
            return Member::new(entry, long_name, long_link, pax).map(Some);
        }
    }
}

impl<'a, R: Read> Iterator for Members<'a, R> {
    type Item = Result<Member<'a, R>, MemberError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let next = self.next_member();
        if !matches!(next, Ok(Some(_))) {
            self.done = true;
        }
        next.transpose()
    }
}

/// GNU long names and links may end in a NUL.
fn trim_nul(mut bytes: Vec<u8>) -> Vec<u8> {
    if bytes.last() == Some(&0) {
        bytes.pop();
    }
    bytes
}

/// One PAX record: its key and value.
type Record<'a> = (&'a [u8], &'a [u8]);

/// The PAX records of one set, refusing any that do not parse.
fn records(pax: &[u8]) -> Result<Vec<Record<'_>>, MemberError> {
    tar::PaxExtensions::new(pax)
        .map(|r| r.map(|r| (r.key_bytes(), r.value_bytes())).map_err(|_| MemberError::BadPax("a record")))
        .collect()
}

fn number(value: &[u8], what: &'static str) -> Result<u64, MemberError> {
    std::str::from_utf8(value).ok().and_then(|v| v.parse().ok()).ok_or(MemberError::BadPax(what))
}

impl<'a, R: Read> Member<'a, R> {
    fn new(
        entry: tar::Entry<'a, R>,
        long_name: Option<Vec<u8>>,
        long_link: Option<Vec<u8>>,
        pax: Option<Vec<u8>>,
    ) -> Result<Member<'a, R>, MemberError> {
        let (mut pax_path, mut pax_link, mut uid, mut gid) = (None, None, None, None);
        for (key, value) in records(pax.as_deref().unwrap_or_default())? {
            match key {
                b"path" if pax_path.is_none() => pax_path = Some(value),
                b"linkpath" if pax_link.is_none() => pax_link = Some(value),
                b"uid" if uid.is_none() => uid = Some(number(value, "uid")?),
                b"gid" if gid.is_none() => gid = Some(number(value, "gid")?),
                b"size" => {
                    let (pax, header) = (number(value, "size")?, entry.size());
                    if pax != header {
                        return Err(MemberError::PaxSize { pax, header });
                    }
                }
                _ => {}
            }
        }
        let header = entry.header();
        let path = match (long_name, pax_path) {
            (Some(name), _) => trim_nul(name),
            (None, Some(p)) => p.to_vec(),
            (None, None) => header.path_bytes().into_owned(),
        };
        let link = match (long_link, pax_link) {
            (Some(name), _) => Some(trim_nul(name)),
            (None, Some(p)) => Some(p.to_vec()),
            (None, None) => header.link_name_bytes().map(|l| l.into_owned()),
        };
        Ok(Member { entry, path, link, uid, gid })
    }
}

/// A name from a tarball as an error message shows it: escaped, and cut to a short prefix.
pub(crate) fn shown(path: &Path) -> String {
    let bytes = path.as_os_str().as_bytes();
    match bytes.get(..SHOWN_BYTES) {
        Some(prefix) if bytes.len() > SHOWN_BYTES => {
            format!("{:?}... ({} bytes)", String::from_utf8_lossy(prefix), bytes.len())
        }
        _ => format!("{:?}", String::from_utf8_lossy(bytes)),
    }
}
