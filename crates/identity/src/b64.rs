//! Standard base64 (RFC 4648 §4, padded) for the stored key set.

use base64::Engine as _;

/// Encodes `bytes` as padded standard base64.
pub(crate) fn encode(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Decodes padded standard base64 (canonical input only); the error never holds the text.
pub(crate) fn decode(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    base64::engine::general_purpose::STANDARD.decode(text)
}
