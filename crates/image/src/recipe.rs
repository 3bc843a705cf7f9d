//! The recipe of the default image and its hash.

use serde::Serialize;
use sha2::{Digest, Sha256};

/// What debootstrap is asked to build.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Recipe {
    /// Bumped when the build steps themselves change.
    pub format: u32,
    /// Debian suite.
    pub suite: String,
    /// debootstrap variant.
    pub variant: String,
    /// Packages added to the variant's set.
    pub include: Vec<String>,
}

impl Default for Recipe {
    fn default() -> Self {
        Recipe {
            format: 1,
            suite: "bookworm".into(),
            variant: "minbase".into(),
            include: vec!["python3".into(), "ca-certificates".into(), "procps".into()],
        }
    }
}

impl Recipe {
    /// Hex SHA-256 of the recipe's canonical JSON.
    pub fn hash(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        hex::encode(Sha256::digest(&json))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_change_to_the_recipe_changes_its_hash() {
        let base = Recipe::default();
        let mut other = base.clone();
        other.include.push("git".into());
        assert_ne!(base.hash(), other.hash());
        assert_eq!(base.hash(), Recipe::default().hash());
    }
}
