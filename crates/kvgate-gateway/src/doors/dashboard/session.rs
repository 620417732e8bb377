//! Login cookies for the dashboard.
//!
//! A browser that navigates to a page cannot add the admin key as a header,
//! and a key in the URL would end up in history, proxies and logs. So the
//! login form's script sends the key once, as a header, to
//! `/dashboard/login`, which answers with a cookie holding a token that
//! proves the login, not the key itself. A token is `ISSUED.MAC`: the issue
//! time in unix seconds and sha256(secret ‖ issued) under a secret drawn at
//! startup. Tokens expire by themselves and all die with the process;
//! nothing is stored per login.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The cookie's name.
pub(crate) const COOKIE: &str = "kvgate_dashboard";

/// Mints and checks login tokens.
pub(crate) struct Sessions {
    /// `None` when the OS had no randomness to give: cookie login is then
    /// off and only the header works.
    secret: Option<[u8; 32]>,
    lifetime: Duration,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        f.debug_struct("Sessions").field("lifetime", &self.lifetime).finish_non_exhaustive()
    }
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Sessions {
    pub(crate) fn new(lifetime: Duration) -> Sessions {
        let mut secret = [0u8; 32];
        let secret = match getrandom::fill(&mut secret) {
            Ok(()) => Some(secret),
            Err(e) => {
                tracing::error!(error = %e, "no randomness for dashboard login cookies; only the admin-key header works");
                None
            }
        };
        Sessions { secret, lifetime }
    }

    /// How long a cookie lives.
    pub(crate) fn lifetime(&self) -> Duration {
        self.lifetime
    }

    fn mac(secret: &[u8; 32], issued: u64) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(secret);
        h.update(issued.to_be_bytes());
        h.finalize().into()
    }

    /// A token issued at `now`, or `None` when cookie login is off.
    pub(crate) fn mint(&self, now: SystemTime) -> Option<String> {
        let secret = self.secret.as_ref()?;
        let issued = unix_secs(now);
        let mac: String = Self::mac(secret, issued).iter().map(|b| format!("{b:02x}")).collect();
        Some(format!("{issued}.{mac}"))
    }

    /// Whether `token` was minted by this process and has not expired.
    pub(crate) fn valid(&self, token: &str, now: SystemTime) -> bool {
        let Some(secret) = self.secret.as_ref() else { return false };
        let Some((issued, mac)) = token.split_once('.') else { return false };
        let Ok(issued) = issued.parse::<u64>() else { return false };
        // Issued in the future (never by us) or too long ago.
        let age = unix_secs(now).checked_sub(issued);
        if age.is_none_or(|a| a > self.lifetime.as_secs()) {
            return false;
        }
        let Some(presented) = hex32(mac) else { return false };
        bool::from(Self::mac(secret, issued).ct_eq(&presented))
    }
}

/// 64 lowercase hex digits as bytes.
fn hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_verify_and_expire() {
        let s = Sessions::new(Duration::from_secs(60));
        let t0 = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let token = s.mint(t0).unwrap();
        assert!(s.valid(&token, t0));
        assert!(s.valid(&token, t0 + Duration::from_secs(60)));
        assert!(!s.valid(&token, t0 + Duration::from_secs(61)), "expired");
        assert!(!s.valid(&token, t0 - Duration::from_secs(1)), "issued in the future");
        // Another process (another secret) does not accept it.
        assert!(!Sessions::new(Duration::from_secs(60)).valid(&token, t0));
    }

    #[test]
    fn forged_tokens_are_refused() {
        let s = Sessions::new(Duration::from_secs(3600));
        let t0 = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let token = s.mint(t0).unwrap();
        let (issued, mac) = token.split_once('.').unwrap();
        // Moving the issue time forward (to extend a token) breaks the MAC.
        let later = format!("{}.{mac}", issued.parse::<u64>().unwrap() + 10);
        assert!(!s.valid(&later, t0 + Duration::from_secs(20)));
        let mut flipped = mac.to_owned().into_bytes();
        flipped[0] = if flipped[0] == b'0' { b'1' } else { b'0' };
        let flipped = format!("{issued}.{}", String::from_utf8(flipped).unwrap());
        for bad in [
            "",
            ".",
            "x.y",
            &format!("{issued}."),
            &format!("{issued}.{}", &mac[..62]),
            &flipped,
            "é.é",
        ] {
            assert!(!s.valid(bad, t0), "{bad:?}");
        }
    }
}
