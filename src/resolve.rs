//! Which run a person means: the one resolver of both binaries (and of hosts), and which runs a
//! listing shows ([`listed`]). A run is named
//! by its full id, a unique prefix of it (8 characters or more, any case), its name (`--name`,
//! a spec's `name`; the latest run of that name), or the host's tool-call id.
//!
//! Invariants:
//! * a text that could reach a path (`/`, `\`, NUL, control characters, only dots) or that no
//!   run can be named (empty, over [`MAX_TEXT_BYTES`]) is refused by [`check_text`] before any
//!   lookup; [`resolve_run`] checks it first, and callers may check it before opening a
//!   journal at all;
//! * every way a text can match is tried: two different runs matched in different ways are an
//!   ambiguity that names both, never a silent choice;
//! * paths are built only from the [`RunId`] returned, never from the text.

use crate::event::{MAX_TEXT_BYTES, RunId, RunIdError};
use crate::journal::Tombstone;
use std::collections::BTreeMap;

use crate::journal::{QueueUsage, ReadError, ResolveError, View, name_alias, tool_call_alias};
use crate::state::{RunState, RunStatus};

/// How many recently ended runs a listing shows besides the active ones, without `all`.
pub const RECENT_TERMINAL_LIMIT: usize = 50;

/// Which runs a listing (`runjournal list`) shows.
#[derive(Debug, Clone, Copy, Default)]
pub struct ListOptions {
    /// Every run, dismissed ones and pruned ones (by their tombstones) too; else the active
    /// runs and the [`RECENT_TERMINAL_LIMIT`] most recently ended, dismissed ones left out.
    pub all: bool,
    /// Only runs in this state.
    pub state: Option<RunStatus>,
}

/// The runs of a listing, newest first (ids sort by creation time).
#[derive(Debug, Clone, Default)]
pub struct Listed {
    pub runs: Vec<RunState>,
    /// With `all`, the pruned runs whose tombstones are kept.
    pub pruned: Vec<Tombstone>,
    /// Each queue a listed run is in: its waiting runs in order, and its use.
    pub queues: BTreeMap<String, (Vec<RunId>, QueueUsage)>,
    /// Each listed run that waits for its dependencies: those that have yet to end.
    pub waiting_for: BTreeMap<RunId, Vec<RunId>>,
}

impl Listed {
    /// The runs a listed run waits for that have yet to end (empty: none).
    pub fn waiting_for(&self, state: &RunState) -> &[RunId] {
        self.waiting_for
            .get(&state.run_id)
            .map_or(&[], Vec::as_slice)
    }

    /// A listed run's queue and its place there (1: the next admitted), while it waits.
    pub fn place_of(&self, state: &RunState) -> Option<(String, u64)> {
        let queue = state.queue.as_ref()?;
        let (waiting, _) = self.queues.get(&queue.name)?;
        let index = waiting.iter().position(|run| *run == state.run_id)?;
        Some((queue.name.clone(), index as u64 + 1))
    }
}

/// Chooses a listing's runs: without `all`, from the active index and the most recently ended,
/// never every run.
pub fn listed(view: &View, options: ListOptions) -> Result<Listed, ReadError> {
    let ids: Vec<RunId> = if options.all {
        view.all_runs()?
    } else {
        let mut ids = view.active_runs()?;
        ids.extend(
            view.recent_terminal(RECENT_TERMINAL_LIMIT)?
                .into_iter()
                .map(|(_, run)| run),
        );
        ids.sort_unstable();
        ids.dedup();
        ids
    };
    let is_wanted = |status: RunStatus| options.state.is_none_or(|wanted| status == wanted);
    let mut runs = Vec::with_capacity(ids.len());
    for run in ids {
        let Some(state) = view.snapshot(run)? else {
            continue;
        };
        if (!options.all && state.dismissed_at_ms.is_some()) || !is_wanted(state.status) {
            continue;
        }
        runs.push(state);
    }
    runs.sort_by_key(|state| std::cmp::Reverse(state.run_id));
    let mut pruned = if options.all {
        view.tombstones()?
    } else {
        Vec::new()
    };
    pruned.retain(|tombstone| is_wanted(RunStatus::from(tombstone.state)));
    pruned.sort_by_key(|tombstone| std::cmp::Reverse(tombstone.run_id));
    let mut queues = BTreeMap::new();
    for state in &runs {
        if let Some(queue) = &state.queue
            && !queues.contains_key(&queue.name)
        {
            let waiting = view.queue_waiting(&queue.name, usize::MAX)?;
            let usage = view.queue_usage(&queue.name)?;
            queues.insert(queue.name.clone(), (waiting, usage));
        }
    }
    let mut waiting_for = BTreeMap::new();
    for state in runs
        .iter()
        .filter(|state| state.is_waiting_for_dependencies())
    {
        waiting_for.insert(state.run_id, view.waiting_for(state)?);
    }
    Ok(Listed {
        runs,
        pruned,
        queues,
        waiting_for,
    })
}

/// Why a text over [`MAX_TEXT_BYTES`] names no run, naming the limit.
const TOO_LONG: &str = "it is over 4096 bytes, the limit of every name and tool-call id";
const _: () = assert!(MAX_TEXT_BYTES == 4096, "TOO_LONG names the limit");

/// Checks `text` before anything is looked up with it (see the module's invariants).
pub fn check_text(text: &str) -> Result<(), ResolveError> {
    let unusable = |why| {
        Err(ResolveError::Unusable {
            text: text.chars().take(64).collect(),
            why,
        })
    };
    if text.trim().is_empty() {
        return unusable("it is empty");
    }
    if text.len() > MAX_TEXT_BYTES {
        return unusable(TOO_LONG);
    }
    if text.contains(['/', '\\']) {
        return unusable("it contains a path separator");
    }
    if text.chars().any(char::is_control) {
        return unusable("it contains a control character");
    }
    if text.chars().all(|c| c == '.') {
        return unusable("it is only dots");
    }
    Ok(())
}

/// How a text matched a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Matched {
    Id,
    Prefix,
    Name,
    ToolCall,
}

impl Matched {
    fn as_str(self) -> &'static str {
        match self {
            Matched::Id => "by id",
            Matched::Prefix => "by id prefix",
            Matched::Name => "by name",
            Matched::ToolCall => "by tool-call id",
        }
    }
}

/// The run `text` names: its full id, a unique prefix, its name or its tool-call id.
///
/// Errors: [`ResolveError::Unusable`] (refused before any lookup), `Ambiguous` (a prefix of
/// several runs), `AmbiguousKinds` (different runs by different ways, each named), `Unknown`
/// (an id or prefix nothing matches), `NoMatch` (not an id, and no name or tool-call id
/// matches: the id error says why it is no id), `Read`.
pub fn resolve_run(view: &View, text: &str) -> Result<RunId, ResolveError> {
    check_text(text)?;
    let mut matches: Vec<(RunId, Matched)> = Vec::new();
    let mut id_error: Option<RunIdError> = None;
    match view.resolve(text) {
        Ok(run) => {
            let how = if text.len() == RunId::LEN {
                Matched::Id
            } else {
                Matched::Prefix
            };
            matches.push((run, how));
        }
        Err(ResolveError::Unknown { .. }) => {}
        Err(ResolveError::BadId(error)) => id_error = Some(error),
        Err(error) => return Err(error),
    }
    for (alias, how) in [
        (name_alias(text), Matched::Name),
        (tool_call_alias(text), Matched::ToolCall),
    ] {
        if let Some(run) = view.lookup_alias(&alias)? {
            matches.push((run, how));
        }
    }
    let first = match matches.first() {
        Some((run, _)) => *run,
        None => {
            let text = text.to_string();
            return Err(match id_error {
                Some(id_error) => ResolveError::NoMatch { text, id_error },
                None => ResolveError::Unknown { text },
            });
        }
    };
    if matches.iter().all(|(run, _)| *run == first) {
        return Ok(first);
    }
    let named = matches
        .iter()
        .map(|(run, how)| format!("run {run} {}", how.as_str()))
        .collect::<Vec<_>>()
        .join(", ");
    Err(ResolveError::AmbiguousKinds {
        text: text.to_string(),
        matches: named,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::event::{Mode, RunSpec, now_ms};
    use crate::journal::{Condition, Journal};
    use crate::testkit as kit;

    fn spec(name: Option<&str>) -> Arc<RunSpec> {
        Arc::new(RunSpec {
            name: name.map(str::to_string),
            ..kit::spec(Mode::Single, vec![kit::shell("s", "true")])
        })
    }

    fn create(journal: &Journal, run: RunId, name: Option<&str>, tool_call: Option<&str>) {
        journal
            .append(
                run,
                vec![kit::created(
                    spec(name),
                    now_ms(),
                    kit::hosts(None, None, tool_call),
                )],
                Condition::expect_head(0),
            )
            .expect("the run is created");
    }

    fn id(first: u8, last: u8) -> RunId {
        let mut bytes = [0x11; 16];
        bytes[0] = first;
        bytes[15] = last;
        RunId::from_bytes(bytes)
    }

    /// Runs: `build` (tool call `call-1`), two runs sharing a long prefix, one named after the
    /// id prefix of another, one named `a/b`.
    struct Fixture {
        _dir: tempfile::TempDir,
        journal: Journal,
        build: RunId,
        twin_a: RunId,
        twin_b: RunId,
        named_like_a_prefix: RunId,
        lonely: RunId,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().expect("temp dir");
        let journal = Journal::open(dir.path().join("journal.redb")).expect("a journal opens");
        let build = id(0x01, 1);
        let twin_a = id(0x02, 1);
        let twin_b = id(0x02, 2);
        let lonely = id(0x03, 1);
        let named_like_a_prefix = id(0x04, 1);
        create(&journal, build, Some("build"), Some("call-1"));
        create(&journal, twin_a, None, None);
        create(&journal, twin_b, None, None);
        create(&journal, lonely, None, Some("call-2"));
        let lonely_prefix = lonely.to_string()[..10].to_string();
        create(&journal, named_like_a_prefix, Some(&lonely_prefix), None);
        create(&journal, id(0x05, 1), Some("a/b"), None);
        Fixture {
            _dir: dir,
            journal,
            build,
            twin_a,
            twin_b,
            named_like_a_prefix,
            lonely,
        }
    }

    #[test]
    fn a_full_id_and_a_unique_prefix_in_any_case_name_their_run() {
        let fixture = fixture();
        let view = fixture.journal.view().expect("a view");
        let text = fixture.build.to_string();
        assert_eq!(resolve_run(&view, &text).expect("full id"), fixture.build);
        assert_eq!(
            resolve_run(&view, &text[..8]).expect("a prefix of 8"),
            fixture.build
        );
        assert_eq!(
            resolve_run(&view, &text[..12].to_ascii_lowercase()).expect("lower case"),
            fixture.build
        );
    }

    #[test]
    fn a_name_and_a_tool_call_id_name_their_run() {
        let fixture = fixture();
        let view = fixture.journal.view().expect("a view");
        assert_eq!(resolve_run(&view, "build").expect("name"), fixture.build);
        assert_eq!(
            resolve_run(&view, "call-1").expect("tool call"),
            fixture.build
        );
        assert_eq!(
            resolve_run(&view, "call-2").expect("tool call"),
            fixture.lonely
        );
    }

    #[test]
    fn a_prefix_of_several_runs_is_ambiguous_and_names_them() {
        let fixture = fixture();
        let view = fixture.journal.view().expect("a view");
        let shared = fixture.twin_a.to_string()[..20].to_string();
        assert_eq!(fixture.twin_b.to_string()[..20], shared);
        let error = resolve_run(&view, &shared).expect_err("two runs");
        assert!(
            matches!(error, ResolveError::Ambiguous { count: 2, .. }),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(message.contains(&fixture.twin_a.to_string()), "{message}");
        assert!(message.contains(&fixture.twin_b.to_string()), "{message}");
    }

    #[test]
    fn a_text_matching_different_runs_in_different_ways_is_ambiguous_and_names_each() {
        let fixture = fixture();
        let view = fixture.journal.view().expect("a view");
        let text = fixture.lonely.to_string()[..10].to_string();
        let error = resolve_run(&view, &text).expect_err("a prefix of one, the name of another");
        assert!(
            matches!(error, ResolveError::AmbiguousKinds { .. }),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(
            message.contains(&format!("run {} by id prefix", fixture.lonely)),
            "{message}"
        );
        assert!(
            message.contains(&format!("run {} by name", fixture.named_like_a_prefix)),
            "{message}"
        );
    }

    #[test]
    fn an_unknown_text_says_what_was_tried() {
        let fixture = fixture();
        let view = fixture.journal.view().expect("a view");
        // Shaped like an id: no run has it, by id or otherwise.
        let error = resolve_run(&view, "7ZZZZZZZZZ").expect_err("unknown");
        assert_eq!(error.to_string(), "no run matches \"7ZZZZZZZZZ\"");
        // Not an id: the message says why, and that no name or tool-call id matched.
        let error = resolve_run(&view, "deploy").expect_err("no such name");
        assert!(matches!(error, ResolveError::NoMatch { .. }), "{error:?}");
        let message = error.to_string();
        assert!(message.contains("name or tool-call id"), "{message}");
        assert!(message.contains("run id"), "{message}");
        let error = resolve_run(&view, "01AR").expect_err("too short, no alias");
        assert!(error.to_string().contains("shorter than 8"), "{error}");
    }

    #[test]
    fn path_characters_are_refused_before_any_lookup() {
        let fixture = fixture();
        let view = fixture.journal.view().expect("a view");
        // A run really is named `a/b`: the refusal comes before the lookup that would find it.
        assert!(
            view.lookup_alias(&name_alias("a/b"))
                .expect("read")
                .is_some()
        );
        for text in [
            "a/b",
            "../../etc/passwd",
            "01ARZ3ND/../x",
            "..",
            ".",
            "01ARZ3NDEKTSV4RRFFQ69G5FAV/",
            "a\\b",
            "a\0b",
            "line\nbreak",
            "",
            "   ",
        ] {
            assert!(
                matches!(check_text(text), Err(ResolveError::Unusable { .. })),
                "{text:?}"
            );
            let error = resolve_run(&view, text).expect_err("refused");
            assert!(
                matches!(error, ResolveError::Unusable { .. }),
                "{text:?}: {error:?}"
            );
            assert!(error.to_string().contains("run id"), "{error}");
        }
        assert!(check_text(&"x".repeat(MAX_TEXT_BYTES + 1)).is_err());
        for text in ["build", "01ARZ3ND", "v1.2", "my run"] {
            assert!(check_text(text).is_ok(), "{text:?}");
        }
    }
}
