//! The recipes of the built-in images and their hashes.

use serde::Serialize;
use sha2::{Digest, Sha256};

/// The image sandboxes get when they name none: what agents expect to work in.
pub const DEFAULT_IMAGE: &str = "default";
/// The smaller image, for those who want only Python.
pub const MINIMAL_IMAGE: &str = "minimal";
/// The built-in image names, default first.
pub const BUILTIN_IMAGES: [&str; 2] = [DEFAULT_IMAGE, MINIMAL_IMAGE];

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
    /// Packages installed with apt-get into the debootstrapped tree (debootstrap's own resolver
    /// cannot pick among alternatives, which npm's dependencies need). Left out of the hash's
    /// JSON when empty, so recipes without it keep their hash.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub apt: Vec<String>,
}

impl Recipe {
    /// Debian minbase with python3: the image every sandbox had before `default` existed (its
    /// hash is unchanged, so existing caches still hold it).
    pub fn minimal() -> Recipe {
        Recipe {
            format: 1,
            suite: "bookworm".into(),
            variant: "minbase".into(),
            include: vec!["python3".into(), "ca-certificates".into(), "procps".into()],
            apt: Vec::new(),
        }
    }

    /// The minimal image plus what agents reach for: pip, venv, git, curl, Node.js and npm, all
    /// from Debian. Built on the minimal image's cached tree.
    pub fn standard() -> Recipe {
        let apt = ["python3-pip", "python3-venv", "git", "curl", "nodejs", "npm"];
        Recipe { apt: apt.iter().map(|p| p.to_string()).collect(), ..Recipe::minimal() }
    }

    /// The recipe this one builds on: the same without the apt stage; `None` when it has none.
    pub fn parent(&self) -> Option<Recipe> {
        (!self.apt.is_empty()).then(|| Recipe { apt: Vec::new(), ..self.clone() })
    }

    /// The recipe of a built-in image name; `None` for any other name.
    pub fn named(name: &str) -> Option<Recipe> {
        match name {
            DEFAULT_IMAGE => Some(Recipe::standard()),
            MINIMAL_IMAGE => Some(Recipe::minimal()),
            _ => None,
        }
    }

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
        let base = Recipe::minimal();
        let mut other = base.clone();
        other.include.push("git".into());
        assert_ne!(base.hash(), other.hash());
        assert_eq!(base.hash(), Recipe::minimal().hash());
    }

    #[test]
    fn the_builtin_names_have_distinct_recipes_and_the_minimal_one_kept_its_hash() {
        let default = Recipe::named(DEFAULT_IMAGE).unwrap();
        let minimal = Recipe::named(MINIMAL_IMAGE).unwrap();
        assert_ne!(default.hash(), minimal.hash());
        for p in ["python3-pip", "python3-venv", "git", "curl", "nodejs", "npm"] {
            assert!(default.apt.iter().any(|i| i == p), "{p} missing from the default image");
        }
        assert_eq!(default.parent(), Some(minimal.clone()), "default builds on the minimal tree");
        assert_eq!(minimal.parent(), None);
        // The cache key of the image that was the only one before: caches keep working.
        assert!(minimal.hash().starts_with("005e453c7d18c5bb"), "{}", minimal.hash());
        assert!(Recipe::named("alpine").is_none());
    }
}
