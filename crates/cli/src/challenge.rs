//! Proving a branchboxd holds a token before the token is sent to it: it answers a fresh nonce
//! with an HMAC keyed by the token's digest over its listen address. Used for the service named
//! by `BRANCHBOX_URL` or `<data>/service/url` (`remote.rs`) and for `remote pull --peer`.

use serde_json::Value;
use std::time::Duration;

/// The proof a service holding `token` gives for `nonce` at `listen` (see
/// `branchbox_service::auth::proof`, which this must match).
fn proof(token: &str, listen: &str, nonce: &str) -> String {
    use hmac::{Hmac, Mac};
    use sha2::{Digest, Sha256};
    let key = Sha256::digest(token.as_bytes());
    // HMAC takes keys of any length; an empty proof (never a match) keeps this total anyway.
    let Ok(mut mac) = <Hmac<Sha256> as Mac>::new_from_slice(&key) else { return String::new() };
    mac.update(format!("branchbox-service-proof\n{listen}\n{nonce}").as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// Asks the branchboxd at `url` to prove it holds `token` (an HMAC over a fresh nonce); with
/// `expect_listen`, the proof must also name that address. The token itself is not sent.
pub(crate) fn verify(
    agent: &ureq::Agent,
    url: &str,
    token: &str,
    expect_listen: Option<&str>,
) -> Result<(), String> {
    let nonce = hex::encode(rand::random::<[u8; 32]>());
    let answer: Value = agent
        .get(&format!("{}/v1/auth/challenge", url.trim_end_matches('/')))
        .query("nonce", &nonce)
        .timeout(Duration::from_secs(5))
        .call()
        .map_err(|e| format!("the challenge failed ({e})"))?
        .into_json()
        .map_err(|e| format!("the challenge's answer is not JSON ({e})"))?;
    let listen = answer["listen"].as_str().ok_or("the challenge's answer names no address")?;
    if let Some(want) = expect_listen {
        if listen != want {
            return Err(format!("it proved itself for {listen:?}, not {want:?}"));
        }
    }
    let want = proof(token, listen, &nonce);
    let proofs = answer["proofs"].as_array().map(Vec::as_slice).unwrap_or_default();
    if proofs.iter().any(|p| p.as_str() == Some(want.as_str())) {
        Ok(())
    } else {
        Err("its answer does not match the token".into())
    }
}

#[cfg(test)]
mod tests {
    use super::proof;

    #[test]
    fn proofs_match_the_services_definition() {
        // The same vector pins the service's `auth::proof` (and was computed independently with
        // Python's hmac module), so client and service cannot drift apart.
        let p = proof("secret-token-0123456789", "127.0.0.1:7420", "00ff");
        assert_eq!(p, "7af8c442632867802dc53a3e0a0fd3b677ffcd76eceee573d08d1a3044cd570a");
        assert_ne!(p, proof("secret-token-0123456789", "127.0.0.1:7421", "00ff"));
        assert_ne!(p, proof("secret-token-0123456789", "127.0.0.1:7420", "00fe"));
        assert_ne!(p, proof("other-token-0123456789", "127.0.0.1:7420", "00ff"));
    }
}
