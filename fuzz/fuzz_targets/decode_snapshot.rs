#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| runjournal::fuzz::decode_snapshot(data));
