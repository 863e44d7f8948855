//! The checks every id and string field of a request goes through, shared by the request
//! types' `validate` methods and the routes so that one rule holds everywhere. An error quotes
//! a refused value only escaped and cut ([`berth_input::quoted`]), and a secret or a mount flag never.

use std::collections::BTreeMap;

use berth_sys::is_unprintable;

use crate::types::InvalidField;

/// An id that becomes a path segment (plugin, instance, volume, alloc, job and node ids):
/// [`berth_sys::validate_path_segment`]. `kind` names it in the message, `field` is the JSON
/// field.
pub(crate) fn segment(
    field: &'static str,
    kind: &'static str,
    id: &str,
) -> Result<(), InvalidField> {
    berth_sys::validate_path_segment(kind, id).map_err(|e| InvalidField {
        field,
        reason: e.to_string(),
    })
}

/// A string a plugin or the user chose that is not a path segment (a provider's snapshot id, a
/// snapshot name): non-empty, at most `max` bytes, no control or bidirectional-text character.
pub(crate) fn printable(field: &'static str, value: &str, max: usize) -> Result<(), InvalidField> {
    let reason = if value.is_empty() {
        "must not be empty".to_string()
    } else if value.len() > max {
        format!("is {} bytes long, more than {max}", value.len())
    } else if value.chars().any(is_unprintable) {
        "must not contain control characters".to_string()
    } else {
        return Ok(());
    };
    Err(InvalidField { field, reason })
}

/// A string bounded in size only (spec texts, whose lines and tabs are theirs to have).
pub(crate) fn bounded(field: &'static str, value: &str, max: usize) -> Result<(), InvalidField> {
    if value.len() > max {
        return Err(InvalidField {
            field,
            reason: format!("is {} bytes long, more than {max}", value.len()),
        });
    }
    Ok(())
}

/// A `map<string, string>` of CSI (parameters, secrets): keys and values together at most
/// [`berth_volume::MAX_MAP_BYTES`], every key a printable non-empty string. Values are never
/// looked at or quoted (they may be secrets).
pub(crate) fn string_map(
    field: &'static str,
    map: &BTreeMap<String, String>,
) -> Result<(), InvalidField> {
    let invalid = |reason| Err(InvalidField { field, reason });
    let bytes: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > berth_volume::MAX_MAP_BYTES {
        return invalid(format!(
            "takes {bytes} bytes, more than {} (the CSI limit for a map)",
            berth_volume::MAX_MAP_BYTES
        ));
    }
    if map.keys().any(String::is_empty) {
        return invalid("a key must not be empty".into());
    }
    if let Some(key) = map.keys().find(|k| k.chars().any(is_unprintable)) {
        return invalid(format!(
            "key {} must not contain control characters",
            berth_input::quoted(key)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_strings() {
        assert_eq!(printable("name", "snap-1", 128), Ok(()));
        let reason = |v: &str| printable("name", v, 8).unwrap_err().reason;
        assert_eq!(reason(""), "must not be empty");
        assert_eq!(reason("123456789"), "is 9 bytes long, more than 8");
        for bad in ["a\tb", "a\u{202e}b", "\0", "a\u{7f}"] {
            assert_eq!(
                reason(bad),
                "must not contain control characters",
                "{bad:?}"
            );
        }
    }

    #[test]
    fn maps_are_bounded_and_values_never_quoted() {
        let map = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        assert_eq!(string_map("secrets", &map("token", "a\nb")), Ok(()));
        let err = string_map("secrets", &map("token", &"s".repeat(5000))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "secrets: takes 5005 bytes, more than 4096 (the CSI limit for a map)"
        );
        let err = string_map("secrets", &map("a\nb", "hunter2")).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"secrets: key "a\nb" must not contain control characters"#
        );
        assert!(string_map("secrets", &map("", "hunter2")).is_err());
    }
}
