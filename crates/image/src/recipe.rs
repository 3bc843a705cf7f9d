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
    /// An unprivileged account made after the apt stage: home `/home/<name>`, uid and gid
    /// 1000, login shell bash, passwordless sudo. Left out of the hash's JSON when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// The account of the default image, as E2B's sandboxes have it: SDKs run commands as this
/// user in its home unless told otherwise.
const DEFAULT_USER: &str = "user";

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
            user: None,
        }
    }

    /// The minimal image plus what agents reach for: pip, venv, git, curl, Node.js and npm, all
    /// from Debian, and sudo for the unprivileged `user` account. Built on the minimal image's
    /// cached tree.
    pub fn standard() -> Recipe {
        let apt = ["python3-pip", "python3-venv", "git", "curl", "nodejs", "npm", "sudo"];
        Recipe {
            apt: apt.iter().map(|p| p.to_string()).collect(),
            user: Some(DEFAULT_USER.into()),
            ..Recipe::minimal()
        }
    }

    /// The recipe this one builds on: the same without the apt stage and the account; `None`
    /// when it has no apt stage.
    pub fn parent(&self) -> Option<Recipe> {
        (!self.apt.is_empty()).then(|| Recipe { apt: Vec::new(), user: None, ..self.clone() })
    }

    /// The shell commands that make the account of `user`, run in the tree after apt-get:
    /// `None` when the recipe has none. The name is checked first, as it lands in a shell line
    /// and a sudoers file.
    pub fn user_setup(&self) -> Option<Result<String, String>> {
        let name = self.user.as_deref()?;
        let valid = !name.is_empty()
            && name.len() <= 32
            && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
        if !valid {
            return Some(Err(format!(
                "image user {name:?} is not a valid account name: lowercase letters, digits, '_' and '-', \
                 at most 32, starting with a letter or '_'"
            )));
        }
        Some(Ok(format!(
            "useradd --create-home --home-dir /home/{name} --shell /bin/bash --uid 1000 --user-group {name} && \
             echo '{name} ALL=(ALL:ALL) NOPASSWD: ALL' > /etc/sudoers.d/{name} && \
             chmod 0440 /etc/sudoers.d/{name}"
        )))
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
        for p in ["python3-pip", "python3-venv", "git", "curl", "nodejs", "npm", "sudo"] {
            assert!(default.apt.iter().any(|i| i == p), "{p} missing from the default image");
        }
        assert_eq!(default.parent(), Some(minimal.clone()), "default builds on the minimal tree");
        assert_eq!(minimal.parent(), None);
        // The cache key of the image that was the only one before: caches keep working.
        assert!(minimal.hash().starts_with("005e453c7d18c5bb"), "{}", minimal.hash());
        assert!(Recipe::named("alpine").is_none());
        assert_eq!(default.user.as_deref(), Some(DEFAULT_USER));
        assert_eq!(minimal.user, None);
    }

    #[test]
    fn the_account_setup_makes_home_and_sudoers_and_refuses_names_a_shell_would_read() {
        let setup = Recipe::standard().user_setup().unwrap().unwrap();
        assert!(setup.contains("--home-dir /home/user"), "{setup}");
        assert!(setup.contains("/etc/sudoers.d/user"), "{setup}");
        assert!(setup.contains("NOPASSWD: ALL"), "{setup}");
        assert!(Recipe::minimal().user_setup().is_none());
        for bad in ["", "Root", "a b", "x;reboot", "9lives", &"a".repeat(33)] {
            let r = Recipe { user: Some(bad.to_string()), ..Recipe::standard() };
            assert!(r.user_setup().unwrap().is_err(), "{bad:?} accepted");
        }
    }
}
