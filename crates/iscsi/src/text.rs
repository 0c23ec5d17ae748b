//! Text keys (RFC 7143 §6.1): `key=value` pairs, each ended by a NUL, in login and text PDUs.

/// Largest text (login or text request, continuations included) the target takes.
pub const TEXT_MAX_BYTES: usize = 64 * 1024;

/// Why text could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    /// A pair without `=`, an empty key, or bytes that are not UTF-8.
    #[error("malformed text key: {0:?}")]
    Malformed(String),
    /// The same key twice in one request (RFC 7143 §6.1: a protocol error).
    #[error("key {0} sent twice")]
    Duplicate(String),
    /// More than [`TEXT_MAX_BYTES`].
    #[error("text of more than {TEXT_MAX_BYTES} bytes")]
    TooLong,
}

/// Parses `key=value\0...` (a missing final NUL is accepted; empty strings between NULs are
/// skipped, as padding may leave them).
pub fn parse(data: &[u8]) -> Result<Vec<(String, String)>, TextError> {
    if data.len() > TEXT_MAX_BYTES {
        return Err(TextError::TooLong);
    }
    let mut out: Vec<(String, String)> = Vec::new();
    for pair in data.split(|&b| b == 0).filter(|p| !p.is_empty()) {
        let text = std::str::from_utf8(pair)
            .map_err(|_| TextError::Malformed(String::from_utf8_lossy(pair).into()))?;
        let (key, value) = text.split_once('=').ok_or_else(|| TextError::Malformed(text.into()))?;
        if key.is_empty() || key.len() > 63 {
            return Err(TextError::Malformed(text.into()));
        }
        if out.iter().any(|(k, _)| k == key) {
            return Err(TextError::Duplicate(key.into()));
        }
        out.push((key.to_string(), value.to_string()));
    }
    Ok(out)
}

/// Encodes pairs as `key=value\0...`.
pub fn encode(pairs: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip_and_bad_text_is_refused() {
        let pairs = parse(b"InitiatorName=iqn.x\0SessionType=Normal\0\0").expect("parse");
        assert_eq!(
            pairs,
            [("InitiatorName".into(), "iqn.x".into()), ("SessionType".into(), "Normal".into())]
        );
        assert_eq!(parse(&encode(&pairs)).expect("again"), pairs);
        assert_eq!(parse(b"a=1\0a=2"), Err(TextError::Duplicate("a".into())));
        assert!(matches!(parse(b"novalue\0"), Err(TextError::Malformed(_))));
        assert!(matches!(parse(b"=x\0"), Err(TextError::Malformed(_))));
        assert!(matches!(parse(&[0xFF, b'=', b'1']), Err(TextError::Malformed(_))));
        assert_eq!(parse(&vec![b'a'; TEXT_MAX_BYTES + 1]), Err(TextError::TooLong));
    }
}
