//! The fuzzer's corpus as regression tests: every input it kept goes through the same checks
//! as under the fuzzer (`deadletter::fuzz_ingest`), without needing a fuzzer.

#[test]
fn every_fuzz_corpus_input_passes_the_ingest_checks() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/ingest");
    let ingestor =
        deadletter::ingest::Ingestor::new(&deadletter::config::Config::default_config().unwrap());
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let outcome = std::panic::catch_unwind(|| deadletter::fuzz_ingest(&ingestor, &data));
        assert!(
            outcome.is_ok(),
            "{} fails the ingest checks",
            path.display()
        );
        n += 1;
    }
    assert!(n >= 6, "the corpus is missing ({n} inputs)");
}
