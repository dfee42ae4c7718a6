//! Opaque, URL-safe page tokens (API.md 1.5). They carry the cursor and the filter of the listing
//! that produced them, never expire, and are refused when they belong to another endpoint.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Which listing a token belongs to; the prefix is part of the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    Pull,
    Observations,
    History,
}

impl TokenKind {
    fn prefix(self) -> &'static str {
        match self {
            TokenKind::Pull => "p1.",
            TokenKind::Observations => "o1.",
            TokenKind::History => "h1.",
        }
    }
}

pub fn encode<T: Serialize>(kind: TokenKind, state: &T) -> String {
    let json = serde_json::to_vec(state).unwrap_or_default();
    format!("{}{}", kind.prefix(), URL_SAFE_NO_PAD.encode(json))
}

/// `None` for a malformed token or one minted by another endpoint.
pub fn decode<T: DeserializeOwned>(kind: TokenKind, token: &str) -> Option<T> {
    let body = token.trim().strip_prefix(kind.prefix())?;
    if body.len() > 16 * 1024 {
        return None;
    }
    let bytes = URL_SAFE_NO_PAD.decode(body).ok()?;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct Cursor {
        a: i64,
        t: Vec<String>,
    }

    #[test]
    fn round_trip_and_kind_check() {
        let c = Cursor { a: 44, t: vec!["household".into()] };
        let tok = encode(TokenKind::Pull, &c);
        assert!(tok.chars().all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch)));
        assert_eq!(decode::<Cursor>(TokenKind::Pull, &tok), Some(c));
        assert_eq!(decode::<Cursor>(TokenKind::History, &tok), None);
        assert_eq!(decode::<Cursor>(TokenKind::Pull, "p1.!!!"), None);
        assert_eq!(decode::<Cursor>(TokenKind::Pull, "garbage"), None);
    }
}
