//! How documents (payloads, error objects) are stored: raw below a size threshold, zstd above
//! it, always with the original size and sha256 so a tombstone can later prove what was there.
//! Encoding runs on the caller's thread, before the writer, so the writer only copies bytes.
//!
//! Compression uses a raw-content zstd dictionary of what n8n documents are made of (field
//! names, node option keys, stock messages, stack-frame module paths: `zstd-dict-n8n-v1.txt`).
//! A 2 KB NodeApiError is mostly that boilerplate, so the dictionary roughly halves what is
//! stored. The dictionary is part of the file format: never edit it; add a v2 beside it.

use sha2::{Digest, Sha256};

use super::StoreError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    Raw,
    /// zstd with no dictionary (kept readable; not written any more).
    Zstd,
    /// zstd with the n8n v1 dictionary.
    ZstdN8n1,
}

/// The v1 dictionary, embedded: every build must decode what any build wrote.
const DICT_N8N_V1: &[u8] = include_bytes!("zstd-dict-n8n-v1.txt");

impl Codec {
    pub fn as_str(self) -> &'static str {
        match self {
            Codec::Raw => "raw",
            Codec::Zstd => "zstd",
            Codec::ZstdN8n1 => "zstd-n8n1",
        }
    }

    pub fn parse(s: &str) -> Result<Codec, StoreError> {
        match s {
            "raw" => Ok(Codec::Raw),
            "zstd" => Ok(Codec::Zstd),
            "zstd-n8n1" => Ok(Codec::ZstdN8n1),
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
        if let Ok(z) = compress(doc, level) {
            // Keep the smaller form: already-compressed data can grow.
            if z.len() < doc.len() {
                return Encoded {
                    codec: Codec::ZstdN8n1,
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

thread_local! {
    /// One zstd context per thread, reused: creating one costs more than compressing 2 KB.
    static COMPRESSOR: std::cell::RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { std::cell::RefCell::new(None) };
}

fn compress(doc: &[u8], level: i32) -> std::io::Result<Vec<u8>> {
    COMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if !matches!(&*slot, Some((l, _)) if *l == level) {
            *slot = Some((
                level,
                zstd::bulk::Compressor::with_dictionary(level, DICT_N8N_V1)?,
            ));
        }
        match slot.as_mut() {
            Some((_, c)) => c.compress(doc),
            None => unreachable!("set just above"),
        }
    })
}

pub fn decode(codec: Codec, size: usize, bytes: Vec<u8>) -> Result<Vec<u8>, StoreError> {
    let out = match codec {
        Codec::Raw => return Ok(bytes),
        Codec::Zstd => zstd::bulk::decompress(&bytes, size),
        Codec::ZstdN8n1 => zstd::bulk::Decompressor::with_dictionary(DICT_N8N_V1)
            .and_then(|mut d| d.decompress(&bytes, size)),
    };
    out.map_err(|e| StoreError::Corrupt(format!("payload does not decompress: {e}")))
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

    /// What the dictionary buys on what a real n8n sends (figures quoted in BENCHMARKS.md:
    /// `cargo test --lib dictionary -- --nocapture`).
    #[test]
    fn the_n8n_dictionary_shrinks_real_n8n_documents() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/n8n/");
        for name in [
            "error-trigger-body.raw.json",
            "error-trigger-body.dlqHttp500Wf0001.raw.json",
            "error-trigger-body.dlqHttpRefWf0001.raw.json",
            "error-output-item.raw.json",
        ] {
            let doc = std::fs::read(format!("{dir}{name}")).unwrap();
            let plain = zstd::bulk::compress(&doc, 3).unwrap().len();
            let e = encode(&doc, 1024, 3);
            println!(
                "{name}: {} bytes, zstd-3 {plain}, zstd-3+n8n-v1 {}",
                doc.len(),
                e.bytes.len()
            );
            assert_eq!(e.codec, Codec::ZstdN8n1);
            assert!(
                e.bytes.len() < plain,
                "{name}: the dictionary made it bigger"
            );
            assert_eq!(decode(e.codec, e.size, e.bytes).unwrap(), doc);
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
        assert_eq!(e.codec, Codec::ZstdN8n1);
        assert!(e.bytes.len() < big.len() / 4);
    }
}
