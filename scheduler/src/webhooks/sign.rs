//! Signing secrets and signatures (the Standard Webhooks scheme).
//!
//! An endpoint's secret is never stored: it is derived from the operator's key (from the
//! environment, `[webhooks] key_env`) and a random salt the database keeps, so a reader of
//! the database alone cannot sign. Rotating an endpoint is a new salt. A delivery is
//! signed as `v1,<base64 HMAC-SHA256(secret, "{id}.{timestamp}.{body}")>`, once per secret
//! in force (the current one, and the previous one during a rotation's overlap),
//! space-separated in `webhook-signature`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use agentq_core::config::Secret;

type HmacSha256 = Hmac<Sha256>;

/// The prefix of a secret as Standard Webhooks writes it.
pub const SECRET_PREFIX: &str = "whsec_";

/// Stands in for the operator's key when none is configured: secrets are then only as
/// secret as the database (the scheduler warns at start).
const NO_KEY: &[u8] = b"agentq-webhooks-without-an-operator-key";

/// Derives endpoints' secrets from the operator's key.
#[derive(Clone)]
pub struct Signer {
    key: Secret,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer(<redacted>)")
    }
}

impl Signer {
    /// With `key` (the operator's), or without (see [`NO_KEY`]).
    pub fn new(key: Option<Secret>) -> Self {
        Signer {
            key: key.unwrap_or_else(|| Secret::new(String::from_utf8_lossy(NO_KEY))),
        }
    }

    /// The secret bytes of endpoint `id` with salt `salt`.
    pub fn secret(&self, id: &str, salt: &str) -> [u8; 32] {
        let mut mac = mac(self.key.expose().as_bytes());
        mac.update(b"agentq webhook secret\0");
        mac.update(id.as_bytes());
        mac.update(b"\0");
        mac.update(salt.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// The secret as the owner is shown it once: `whsec_` and its base64.
    pub fn shown(&self, id: &str, salt: &str) -> String {
        format!("{SECRET_PREFIX}{}", STANDARD.encode(self.secret(id, salt)))
    }
}

fn mac(key: &[u8]) -> HmacSha256 {
    // HMAC takes a key of any length.
    match HmacSha256::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => unreachable_hmac(),
    }
}

#[cold]
fn unreachable_hmac() -> ! {
    panic!("HMAC-SHA256 refused a key, which it never does")
}

/// One `v1,<base64>` signature of a message.
pub fn signature(secret: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut m = mac(secret);
    m.update(id.as_bytes());
    m.update(b".");
    m.update(timestamp.to_string().as_bytes());
    m.update(b".");
    m.update(body);
    format!("v1,{}", STANDARD.encode(m.finalize().into_bytes()))
}

/// The `webhook-signature` header: one signature per secret, space-separated.
pub fn signature_header(secrets: &[[u8; 32]], id: &str, timestamp: i64, body: &[u8]) -> String {
    secrets
        .iter()
        .map(|s| signature(s, id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A fresh random salt (128 bits, hex).
pub fn new_salt() -> Result<String, getrandom::Error> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification's reference libraries.
    #[test]
    fn signs_as_the_standard_does() {
        let secret = STANDARD
            .decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            .unwrap_or_default();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            signature(&secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn secrets_depend_on_the_key_the_endpoint_and_the_salt() {
        let a = Signer::new(Some(Secret::new("k1")));
        let b = Signer::new(Some(Secret::new("k2")));
        assert_ne!(a.secret("e", "s"), b.secret("e", "s"));
        assert_ne!(a.secret("e", "s"), a.secret("f", "s"));
        assert_ne!(a.secret("e", "s"), a.secret("e", "t"));
        assert!(a.shown("e", "s").starts_with("whsec_"));
    }
}
