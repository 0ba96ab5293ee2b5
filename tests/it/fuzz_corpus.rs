//! Replays every file of the fuzz corpora in `fuzz/corpus/<target>/` through the same code the
//! fuzz target runs, so the corpus is a regression suite without the fuzzer.

use std::path::Path;

fn replay(target: &str, body: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut count = 0;
    for entry in
        std::fs::read_dir(&dir).unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
    {
        let path = entry.expect("corpus entry").path();
        if !path.is_file() {
            continue;
        }
        let data = std::fs::read(&path).expect("corpus file reads");
        let outcome = std::panic::catch_unwind(|| body(&data));
        assert!(
            outcome.is_ok(),
            "{target}: corpus file {} breaks a property",
            path.display()
        );
        count += 1;
    }
    assert!(
        count > 0,
        "{target}: the corpus in {} is empty",
        dir.display()
    );
}

#[test]
fn decode_record_corpus() {
    replay("decode_record", runjournal::fuzz::decode_record);
}

#[test]
fn fold_events_corpus() {
    replay("fold_events", runjournal::fuzz::fold_events);
}

#[test]
fn parse_status_json_corpus() {
    replay("parse_status_json", runjournal::fuzz::parse_status_json);
}

#[test]
fn parse_result_json_corpus() {
    replay("parse_result_json", runjournal::fuzz::parse_result_json);
}

#[test]
fn parse_spec_corpus() {
    replay("parse_spec", runjournal::fuzz::parse_spec);
}

#[test]
fn provider_line_corpus() {
    replay("provider_line", runjournal::fuzz::provider_line);
}
