//! Job-secret authentication: a mutual HMAC-SHA256 challenge-response.
//!
//! Both sides pick a fresh 32-byte random nonce. The accepting side proves
//! it knows the secret first, with `HMAC(secret, "ringwire-auth-v1 server" ||
//! context || client_nonce || server_nonce)`; the dialing side then answers
//! with the same MAC under the label `client`. The context binds the proof to
//! what is being authenticated (a link between two given ranks of one job,
//! or a store connection), the labels keep one side's proof from being
//! reflected as the other's, and the nonces make every proof fresh, so a
//! recorded exchange cannot be replayed. Proofs are compared in constant
//! time. The secret itself never crosses the wire.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;
use std::io;
use subtle::ConstantTimeEq;

/// Bytes in a nonce.
pub(crate) const NONCE_LEN: usize = 32;
/// Bytes in a proof (an HMAC-SHA256 tag).
pub(crate) const PROOF_LEN: usize = 32;

/// Which side of an exchange computes a proof.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// The side that accepted the connection; it proves first.
    Server,
    /// The side that dialed.
    Client,
}

impl Role {
    fn label(self) -> &'static [u8] {
        match self {
            Role::Server => b"ringwire-auth-v1 server",
            Role::Client => b"ringwire-auth-v1 client",
        }
    }
}

/// A job secret. Its `Debug` form does not show it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret(<{} bytes, redacted>)", self.0.len())
    }
}

impl Secret {
    /// Wraps secret bytes; `None` if empty (an empty secret is no secret).
    pub(crate) fn new(bytes: impl Into<Vec<u8>>) -> Option<Secret> {
        let bytes = bytes.into();
        (!bytes.is_empty()).then_some(Secret(bytes))
    }

    /// The proof `role` sends for this exchange.
    pub(crate) fn proof(
        &self,
        role: Role,
        context: &[u8],
        client_nonce: &[u8],
        server_nonce: &[u8],
    ) -> [u8; PROOF_LEN] {
        let mut mac =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        for part in [role.label(), context, client_nonce, server_nonce] {
            // Length-prefixed, so no two different splits give the same input.
            mac.update(&(part.len() as u32).to_le_bytes());
            mac.update(part);
        }
        mac.finalize().into_bytes().into()
    }

    /// Whether `proof` is what `role` must send for this exchange (constant time).
    pub(crate) fn verify(
        &self,
        role: Role,
        context: &[u8],
        client_nonce: &[u8],
        server_nonce: &[u8],
        proof: &[u8],
    ) -> bool {
        let expected = self.proof(role, context, client_nonce, server_nonce);
        proof.len() == PROOF_LEN && bool::from(expected.ct_eq(proof))
    }
}

/// A fresh random nonce from the operating system.
pub(crate) fn nonce() -> io::Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).map_err(|e| io::Error::other(format!("no randomness: {e}")))?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_are_mutual_and_bound_to_everything() {
        let s = Secret::new("hunter2").unwrap();
        let (cn, sn) = (nonce().unwrap(), nonce().unwrap());
        assert_ne!(cn, sn, "fresh nonces");
        let p = s.proof(Role::Server, b"link", &cn, &sn);
        assert!(s.verify(Role::Server, b"link", &cn, &sn, &p));
        // Not valid as the other role's proof (no reflection).
        assert!(!s.verify(Role::Client, b"link", &cn, &sn, &p));
        // Not valid for another context, nonce, or secret.
        assert!(!s.verify(Role::Server, b"store", &cn, &sn, &p));
        assert!(!s.verify(Role::Server, b"link", &sn, &cn, &p));
        let other = Secret::new("hunter3").unwrap();
        assert!(!other.verify(Role::Server, b"link", &cn, &sn, &p));
        // Wrong lengths are refused, not panicked on.
        assert!(!s.verify(Role::Server, b"link", &cn, &sn, &p[..31]));
        assert!(!s.verify(Role::Server, b"link", &cn, &sn, &[]));
    }

    #[test]
    fn empty_secret_is_none_and_debug_hides_it() {
        assert!(Secret::new(Vec::new()).is_none());
        let s = Secret::new("topsecret").unwrap();
        assert!(!format!("{s:?}").contains("topsecret"));
    }
}
