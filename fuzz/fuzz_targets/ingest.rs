//! Everything a producer can post goes through the same code: the Error Trigger parser, the
//! envelope parser, the batch splitter, and the whole ingest pipeline (redaction,
//! classification, encoding). None of it may panic, and redaction must leave no value under a
//! secret key.

#![no_main]

use std::sync::OnceLock;

use deadletter::config::Config;
use deadletter::ingest::Ingestor;
use libfuzzer_sys::fuzz_target;

fn ingestor() -> &'static Ingestor {
    static I: OnceLock<Ingestor> = OnceLock::new();
    I.get_or_init(|| Ingestor::new(&Config::default_config().expect("default config")))
}

fuzz_target!(|data: &[u8]| {
    deadletter::fuzz_ingest(ingestor(), data);
});
