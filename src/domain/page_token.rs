//! Opaque, URL-safe page tokens (docs/api.md §1.5). They carry the cursor and the filter of the listing
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
    Audit,
}

impl TokenKind {
    fn prefix(self) -> &'static str {
        match self {
            TokenKind::Pull => "p1.",
            TokenKind::Observations => "o1.",
            TokenKind::History => "h1.",
            TokenKind::Audit => "a1.",
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

/// Property suite: arbitrary and mutated tokens never panic; real ones round-trip.
#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;
    use serde_json::Value;

    use crate::domain::page_token::{decode, encode, TokenKind};
    use crate::domain::sync::PullCursor;
    use crate::testing::*;

    fn kind() -> impl Strategy<Value = TokenKind> {
        prop_oneof![
            Just(TokenKind::Pull),
            Just(TokenKind::Observations),
            Just(TokenKind::History),
            Just(TokenKind::Audit)
        ]
    }

    proptest! {
        #![proptest_config(config(128))]

        #[test]
        fn arbitrary_strings_never_panic(token in any::<String>(), k in kind()) {
            let _ = decode::<PullCursor>(k, &token);
            let _ = decode::<Value>(k, &token);
        }

        #[test]
        fn prefixed_garbage_never_panics(body in "[A-Za-z0-9_\\-=.+/ ]{0,200}", k in kind()) {
            for prefix in ["p1.", "o1.", "h1.", "a1."] {
                let _ = decode::<PullCursor>(k, &format!("{}{}", prefix, body));
            }
        }

        #[test]
        fn tokens_round_trip_and_mutations_never_panic(
            a in any::<i64>(),
            t in proptest::collection::vec(any::<String>(), 0..4),
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            let cursor = PullCursor { a, t };
            let token = encode(TokenKind::Pull, &cursor);
            prop_assert_eq!(decode::<PullCursor>(TokenKind::Pull, &token), Some(cursor));
            prop_assert_eq!(decode::<PullCursor>(TokenKind::History, &token), None);
            let mut bytes = token.into_bytes();
            let i = at.index(bytes.len());
            bytes[i] = byte;
            let _ = decode::<PullCursor>(TokenKind::Pull, &String::from_utf8_lossy(&bytes));
        }
    }
}
