//! Aliases.

use super::*;

#[test]
fn tool_call_and_name_aliases_resolve_to_the_run() {
    let (_dir, journal) = new_journal();
    let first = create(&journal, Some("nightly"), Some("toolu_01"));
    let anonymous = create(&journal, None, None);
    let view = journal.view().expect("a view opens");
    assert_eq!(
        view.lookup_alias(&tool_call_alias("toolu_01"))
            .expect("reads"),
        Some(first)
    );
    assert_eq!(
        view.lookup_alias(&name_alias("nightly")).expect("reads"),
        Some(first)
    );
    assert_eq!(
        view.lookup_alias(&tool_call_alias("toolu_02"))
            .expect("reads"),
        None
    );
    // A tool-call id and a name are different namespaces.
    assert_eq!(
        view.lookup_alias(&name_alias("toolu_01")).expect("reads"),
        None
    );
    assert_eq!(view.lookup_alias("toolu_01").expect("reads"), None);
    let aliases = view.aliases().expect("aliases read");
    assert!(
        aliases.iter().all(|(_, run)| *run != anonymous),
        "a run without host ids has no alias: {aliases:?}"
    );
    drop(view);

    // The latest run of a name wins; the earlier tool-call alias stays.
    let second = create(&journal, Some("nightly"), Some("toolu_02"));
    let view = journal.view().expect("a view opens");
    assert_eq!(
        view.lookup_alias(&name_alias("nightly")).expect("reads"),
        Some(second)
    );
    assert_eq!(
        view.lookup_alias(&tool_call_alias("toolu_01"))
            .expect("reads"),
        Some(first)
    );
    assert_eq!(
        view.lookup_alias(&tool_call_alias("toolu_02"))
            .expect("reads"),
        Some(second)
    );
    // Appends after creation do not touch aliases.
    drop(view);
    journal
        .append(first, successful_lifecycle("i"), Condition::none())
        .expect("a legal batch is appended");
    let view = journal.view().expect("a view opens");
    assert_eq!(
        view.lookup_alias(&tool_call_alias("toolu_01"))
            .expect("reads"),
        Some(first)
    );
    assert_eq!(view.aliases().expect("aliases read").len(), 3);
}
