//! Corruption is detected on read.

use super::*;
use redb::ReadableTable as _;

fn raw_record(db: &redb::Database, run: RunId, seq: u64) -> Vec<u8> {
    let txn = db.begin_read().expect("a read begins");
    let records = txn.open_table(RECORDS).expect("records opens");
    let value = records
        .get(&tables::record_key(run, seq))
        .expect("reads")
        .expect("the record exists");
    value.value().to_vec()
}

#[test]
fn a_damaged_record_fails_its_checksum_on_read_naming_run_and_seq() {
    let (_dir, path, run) = journal_with_one_lifecycle();
    {
        let db = open_raw(&path);
        let mut bytes = raw_record(&db, run, 2);
        // Damage a byte of the runner instance id: the record still decodes field by field,
        // so only the checksum can tell.
        let at = bytes
            .windows(3)
            .position(|window| window == b"XYZ")
            .expect("the instance id is stored in the RunnerStarted record");
        bytes[at] ^= 0x01;
        write_raw_record(&db, tables::record_key(run, 2), &bytes);
    }

    let journal = Journal::open(&path).expect("the journal opens");
    let view = journal.view().expect("a view opens");
    let error = view.records(run).expect_err("record 2 is damaged");
    assert!(
        matches!(
            &error,
            ReadError::Corrupt(CorruptError::Record {
                run: found,
                seq: 2,
                source: crate::event::DecodeError::Checksum,
            }) if *found == run
        ),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(message.contains("checksum"), "{message}");
    assert!(message.contains(&run.to_string()), "{message}");
    assert!(message.contains("record 2"), "{message}");

    let error = view
        .records_after(0, usize::MAX)
        .expect_err("the log reaches the damaged record");
    assert!(
        matches!(
            &error,
            ReadError::Corrupt(CorruptError::Record { seq: 2, .. })
        ),
        "{error:?}"
    );
    // Records before the damage still read.
    assert_eq!(
        seqs(&view.records_until(run, 1).expect("record 1 is intact")),
        vec![1]
    );
}

#[test]
fn a_record_stored_under_another_key_is_reported_as_a_mismatch() {
    let (_dir, path, run) = journal_with_one_lifecycle();
    let stranger = RunId::from_bytes([0x01; 16]);
    {
        let db = open_raw(&path);
        let second = raw_record(&db, run, 2);
        // Record 2 copied over record 3 of the same run, and under another run's key.
        write_raw_record(&db, tables::record_key(run, 3), &second);
        write_raw_record(&db, tables::record_key(stranger, 1), &second);
    }

    let journal = Journal::open(&path).expect("the journal opens");
    let view = journal.view().expect("a view opens");
    let error = view.records(run).expect_err("record 3 holds record 2");
    assert!(
        matches!(
            &error,
            ReadError::Corrupt(CorruptError::RecordKeyMismatch {
                key_run,
                key_seq: 3,
                found_run,
                found_seq: 2,
            }) if *key_run == run && *found_run == run
        ),
        "{error:?}"
    );
    let error = view
        .records(stranger)
        .expect_err("the record is another run's");
    assert!(
        matches!(
            &error,
            ReadError::Corrupt(CorruptError::RecordKeyMismatch {
                key_run,
                key_seq: 1,
                found_run,
                found_seq: 2,
            }) if *key_run == stranger && *found_run == run
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains(&stranger.to_string()), "{error}");
}
