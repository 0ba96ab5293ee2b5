//! Fuzz-target bodies, shared by the cargo-fuzz targets in `fuzz/` and by the test that
//! replays their corpora (`tests/fuzz_corpus.rs`), so the corpus is a regression suite even
//! without the fuzzer. Each function panics exactly when a property is broken.

use crate::event::RecordEnvelope;

/// Arbitrary bytes as a stored record: decoding never panics, and whatever decodes encodes
/// back to the same bytes (one encoding per record, so a checksum match means an exact match).
pub fn decode_record(data: &[u8]) {
    if let Ok(record) = RecordEnvelope::decode(data) {
        let encoded = record
            .encode()
            .expect("a record that decoded re-encodes within the limits");
        assert_eq!(
            encoded, data,
            "decode then encode gives back the same bytes"
        );
        assert_eq!(
            RecordEnvelope::decode(&encoded).as_ref(),
            Ok(&record),
            "the re-encoded record decodes to the same record"
        );
    }
}
