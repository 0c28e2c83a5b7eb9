//! How documents (payloads, error objects) are stored: raw below a size threshold, zstd above
//! it, always with the original size and sha256 so a tombstone can later prove what was there.
//! Encoding runs on the caller's thread, before the writer, so the writer only copies bytes.

use sha2::{Digest, Sha256};

use super::StoreError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    Raw,
    Zstd,
}

impl Codec {
    pub fn as_str(self) -> &'static str {
        match self {
            Codec::Raw => "raw",
            Codec::Zstd => "zstd",
        }
    }

    pub fn parse(s: &str) -> Result<Codec, StoreError> {
        match s {
            "raw" => Ok(Codec::Raw),
            "zstd" => Ok(Codec::Zstd),
            other => Err(StoreError::Corrupt(format!(
                "unknown payload codec `{other}`"
            ))),
        }
    }
}

/// A document ready for the writer.
#[derive(Clone, Debug)]
pub struct Encoded {
    pub codec: Codec,
    /// Size of the original document, in bytes.
    pub size: usize,
    pub sha256: [u8; 32],
    pub bytes: Vec<u8>,
}

pub fn encode(doc: &[u8], compress_above: usize, level: i32) -> Encoded {
    let sha256: [u8; 32] = Sha256::digest(doc).into();
    if doc.len() > compress_above {
        if let Ok(z) = zstd::bulk::compress(doc, level) {
            // Keep the smaller form: already-compressed data can grow.
            if z.len() < doc.len() {
                return Encoded {
                    codec: Codec::Zstd,
                    size: doc.len(),
                    sha256,
                    bytes: z,
                };
            }
        }
    }
    Encoded {
        codec: Codec::Raw,
        size: doc.len(),
        sha256,
        bytes: doc.to_vec(),
    }
}

pub fn decode(codec: Codec, size: usize, bytes: Vec<u8>) -> Result<Vec<u8>, StoreError> {
    match codec {
        Codec::Raw => Ok(bytes),
        Codec::Zstd => zstd::bulk::decompress(&bytes, size)
            .map_err(|e| StoreError::Corrupt(format!("payload does not decompress: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn documents_round_trip_whatever_their_size(doc in proptest::collection::vec(any::<u8>(), 0..5000), above in 0usize..3000) {
            let e = encode(&doc, above, 3);
            prop_assert_eq!(e.size, doc.len());
            prop_assert_eq!(decode(e.codec, e.size, e.bytes).unwrap(), doc);
        }
    }

    #[test]
    fn small_documents_stay_raw_and_large_ones_shrink() {
        let small = br#"{"a":1}"#;
        assert_eq!(encode(small, 1024, 3).codec, Codec::Raw);
        let big = format!(
            "[{}]",
            vec![r#"{"orderId":"A-1","amount":1}"#; 100].join(",")
        );
        let e = encode(big.as_bytes(), 1024, 3);
        assert_eq!(e.codec, Codec::Zstd);
        assert!(e.bytes.len() < big.len() / 4);
    }
}
