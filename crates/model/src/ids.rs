//! Identifiers. Ids are generated here and parsed strictly at every boundary, so a path built
//! from an id can never escape its directory.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id_type {
    ($name:ident, $prefix:literal, $what:literal) => {
        #[doc = concat!("Identifier of a ", $what, " (`", $prefix, "-` followed by 16 hex digits).")]
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            #[doc = concat!("A fresh random ", $what, " id.")]
            pub fn generate() -> Self {
                $name(format!("{}-{:016x}", $prefix, rand::random::<u64>()))
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            #[doc = concat!("Parses a ", $what, " id, refusing anything else.")]
            pub fn parse(s: &str) -> Result<Self, crate::Error> {
                let hex = s.strip_prefix(concat!($prefix, "-")).unwrap_or("");
                if hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
                    Ok($name(s.to_string()))
                } else {
                    Err(crate::Error::InvalidInput(format!(
                        "{s:?} is not a {} id (expected {}-<16 hex digits>)",
                        $what, $prefix
                    )))
                }
            }
        }

        impl TryFrom<String> for $name {
            type Error = crate::Error;
            fn try_from(s: String) -> Result<Self, Self::Error> {
                $name::parse(&s)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

id_type!(SandboxId, "sbx", "sandbox");
id_type!(SnapshotId, "snap", "snapshot");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_only_their_own_shape() {
        let id = SandboxId::generate();
        assert_eq!(SandboxId::parse(id.as_str()).unwrap(), id);
        for bad in ["", "sbx-", "sbx-../../etc/passwd", "snap-0123456789abcdef", "sbx-0123456789ABCDEF"] {
            assert!(SandboxId::parse(bad).is_err(), "{bad} accepted");
        }
        assert!(SnapshotId::parse("snap-0123456789abcdef").is_ok());
    }
}
