//! Newtypes whose `parse` is the only constructor, so an invalid id, partition or key cannot
//! travel past the edge that received it.

use std::fmt;

use serde::{Serialize, Serializer};

/// The id of one dead letter. It is the SQLite rowid: monotonic, which is what makes cursor
/// pagination stable while inserts happen (a page never shifts under the reader).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct RecordId(i64);

impl RecordId {
    pub fn new(raw: i64) -> Self {
        RecordId(raw)
    }

    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim().trim_start_matches("dl_");
        match t.parse::<i64>() {
            Ok(n) if n > 0 => Ok(RecordId(n)),
            _ => Err(format!("`{s}` is not a dead-letter id (a positive number)")),
        }
    }

    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for RecordId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A partition groups records that share retention, routing and (later) approval rules,
/// typically one per team or business flow. Letters, digits and `_ . : -`, 1 to 64 characters.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Partition(String);

impl Partition {
    pub const MAX_LEN: usize = 64;

    pub fn parse(s: &str) -> Result<Self, String> {
        if s.is_empty() || s.len() > Self::MAX_LEN {
            return Err(format!(
                "partition must be 1 to {} characters, got {}",
                Self::MAX_LEN,
                s.len()
            ));
        }
        if let Some(c) = s
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-')))
        {
            return Err(format!(
                "partition `{}` has the character {c:?}; use letters, digits and _ . : -",
                s.escape_debug()
            ));
        }
        Ok(Partition(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Partition {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// A short, single-purpose string from a producer (idempotency key, event id, tenant …):
/// non-empty after trimming, at most `max` bytes, no control characters.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct ShortText(String);

impl ShortText {
    pub fn parse(field: &str, s: &str, max: usize) -> Result<Self, String> {
        let t = s.trim();
        if t.is_empty() {
            return Err(format!("`{field}` is empty"));
        }
        if t.len() > max {
            return Err(format!(
                "`{field}` is {} bytes long; at most {max} are allowed",
                t.len()
            ));
        }
        if t.chars().any(char::is_control) {
            return Err(format!("`{field}` contains control characters"));
        }
        Ok(ShortText(t.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

/// Groups like failures: class + workflow + node + the error message with numbers and ids
/// masked. Shown as 16 hex digits; stored as a signed 64-bit integer so its index stays small.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fingerprint(u64);

impl Fingerprint {
    pub fn from_u64(v: u64) -> Self {
        Fingerprint(v)
    }

    pub fn from_i64(v: i64) -> Self {
        Fingerprint(v as u64)
    }

    pub fn as_i64(self) -> i64 {
        self.0 as i64
    }

    pub fn parse(s: &str) -> Result<Self, String> {
        if s.len() != 16 {
            return Err(format!("fingerprint `{s}` must be 16 hex digits"));
        }
        u64::from_str_radix(s, 16)
            .map(Fingerprint)
            .map_err(|_| format!("fingerprint `{s}` must be 16 hex digits"))
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl Serialize for Fingerprint {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn partitions_refuse_odd_characters() {
        assert!(Partition::parse("orders-eu.prod:1").is_ok());
        assert!(Partition::parse("").is_err());
        assert!(Partition::parse("a b").is_err());
        assert!(Partition::parse(&"x".repeat(65)).is_err());
    }

    #[test]
    fn record_ids_accept_the_dl_prefix() {
        assert_eq!(RecordId::parse("dl_42").unwrap().get(), 42);
        assert_eq!(RecordId::parse("42").unwrap().get(), 42);
        assert!(RecordId::parse("0").is_err());
        assert!(RecordId::parse("x").is_err());
    }

    proptest! {
        #[test]
        fn fingerprints_round_trip_through_text(v in any::<u64>()) {
            let f = Fingerprint::from_u64(v);
            prop_assert_eq!(Fingerprint::parse(&f.to_string()).unwrap(), f);
            prop_assert_eq!(Fingerprint::from_i64(f.as_i64()), f);
        }
    }
}
