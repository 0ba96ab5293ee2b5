//! The library's modules form layers (ARCHITECTURE.md, "Layers"): a module uses only modules of
//! lower layers, so there is no cycle and the pure core knows nothing of the I/O around it.
//! This test reads every file of `src/` (not `src/bin/`), finds each `crate::<module>` path in
//! its code (comments are skipped; `use crate::{a, b::c}` counts `a` and `b`) and checks it
//! against [`LAYERS`]. A module that is not in [`LAYERS`] fails the test: place it there, and
//! in ARCHITECTURE.md. A module's unit tests (a `tests.rs` file, or what follows
//! `#[cfg(test)]` and `mod tests` in a file) may also use the test kit, `testkit`, which sits
//! above everything.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The top-level modules of the library, lowest layer first. A module may use the modules of
/// the layers before its own, never those of its own layer or after.
const LAYERS: &[&[&str]] = &[
    // Wire types, and the sync shim of the shared cores.
    &["event", "sync"],
    // What the operating system knows, and pure wordings and grammars over the wire types.
    &["platform", "exit", "duration", "logs", "text"],
    // The leaf I/O of files: each of a home's opened under its held directory.
    &["durable_fs"],
    // Pure rules over the wire types, and the leaf I/O of paths and processes.
    &["state", "spec", "home", "liveness", "run_env"],
    &["capacity", "process_group"],
    &["journal"],
    &["projection", "resolve", "control_inbox"],
    &["store", "verify"],
    // Completion hooks, delivered by runners and reconcile passes alike.
    &["hooks"],
    &[
        "control",
        "reconcile",
        "runner",
        "source",
        "replay",
        "ship",
        "recover",
    ],
    &["launch", "show", "retention"],
    // The scrub: every page checked on a schedule, started by the upkeep.
    &["scrub"],
    // The JSON documents and lines of the binaries' reports, and their words.
    &["json"],
    // The handle a host holds: every action, and the upkeep before a read.
    &["runs"],
    // A journal's statistics, its document one of them.
    &["stats"],
    // Built only for tests, benchmarks and fuzzing.
    &["fuzz", "testkit"],
];

/// The module every module's unit tests may use.
const TEST_KIT: &str = "testkit";

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// Every `.rs` file under `dir`, except the binaries' (they use the library as `runjournal::`).
fn source_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|error| panic!("{}: {error}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            if path.file_name().is_some_and(|name| name == "bin") {
                continue;
            }
            source_files(&path, out);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`src/journal/read/view.rs` → `journal`);
/// `None` for the crate root.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).expect("the file is under src");
    let first = relative.components().next()?.as_os_str().to_str()?;
    match first.strip_suffix(".rs") {
        Some("lib") => None,
        Some(module) => Some(module.to_string()),
        None => Some(first.to_string()),
    }
}

/// The modules named right after each `crate::` in `code`.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let identifier = |text: &str| -> String {
        text.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let is_path_start = rest[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'));
        rest = &rest[at + "crate::".len()..];
        if !is_path_start {
            continue;
        }
        let Some(group) = rest.strip_prefix('{') else {
            out.insert(identifier(rest));
            continue;
        };
        // `crate::{a, b::{c, d}, e}`: the first segment of each top-level item.
        let mut depth = 0;
        let mut is_item_start = true;
        for (index, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => is_item_start = true,
                c if c.is_whitespace() => {}
                _ if is_item_start => {
                    out.insert(identifier(&group[index..]));
                    is_item_start = false;
                }
                _ => {}
            }
        }
    }
    out.remove("");
    out
}

/// `code` split into what ships and its unit tests: the whole of a `tests.rs`, or of a file
/// under a `tests` folder, is tests, and elsewhere the tests begin at a `#[cfg(test)]` followed
/// by `mod tests`.
fn split_tests<'a>(file: &Path, code: &'a str) -> (&'a str, &'a str) {
    let is_tests_file = file.file_name().is_some_and(|name| name == "tests.rs")
        || file
            .parent()
            .into_iter()
            .flat_map(Path::iter)
            .skip_while(|part| *part != "src")
            .any(|part| part == "tests");
    if is_tests_file {
        return ("", code);
    }
    let mut offset = 0;
    while let Some(at) = code[offset..].find("#[cfg(test)]") {
        let start = offset + at;
        let after = code[start + "#[cfg(test)]".len()..].trim_start();
        if after.starts_with("mod tests") || after.starts_with("pub(crate) mod tests") {
            return code.split_at(start);
        }
        offset = start + 1;
    }
    (code, "")
}

/// `text` without its `//` comments (line, doc and trailing).
fn code_of(text: &str) -> String {
    text.lines()
        .map(|line| line.find("//").map_or(line, |at| &line[..at]))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_path_scanner_finds_grouped_and_inline_paths_and_skips_comments() {
    let code = code_of(
        "use crate::{event::{A, B}, home};\nlet x = crate::journal::f(); // crate::fuzz\nuse runjournal_crate::x;",
    );
    let found: Vec<_> = crate_paths(&code).into_iter().collect();
    assert_eq!(found, ["event", "home", "journal"]);
}

#[test]
fn unit_tests_are_told_from_the_code_that_ships() {
    let code = "use crate::event;\n#[cfg(test)]\nfn helper() {}\n#[cfg(test)]\nmod tests {\n    use crate::testkit;\n}";
    let (ships, tests) = split_tests(Path::new("src/state/mod.rs"), code);
    assert!(ships.contains("crate::event") && ships.contains("fn helper"));
    assert!(tests.starts_with("#[cfg(test)]\nmod tests") && tests.contains("crate::testkit"));
    let (ships, tests) = split_tests(Path::new("src/state/tests.rs"), code);
    assert_eq!((ships, tests), ("", code));
    let (ships, tests) = split_tests(Path::new("src/journal/tests/queues.rs"), code);
    assert_eq!((ships, tests), ("", code));
}

#[test]
fn no_module_uses_a_module_of_its_own_layer_or_above() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    source_files(&src, &mut files);
    files.sort();
    assert!(files.len() > 20, "found only {} source files", files.len());
    let mut violations = Vec::new();
    for file in &files {
        let shown = file
            .strip_prefix(Path::new(env!("CARGO_MANIFEST_DIR")))
            .unwrap_or(file);
        let Some(module) = module_of(&src, file) else {
            continue;
        };
        let Some(layer) = layer_of(&module) else {
            violations.push(format!(
                "{}: module `{module}` is in no layer of LAYERS",
                shown.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).expect("a source file reads");
        let code = code_of(&text);
        let (ships, tests) = split_tests(file, &code);
        let mut uses = crate_paths(ships);
        uses.extend(
            crate_paths(tests)
                .into_iter()
                .filter(|used| used != TEST_KIT),
        );
        for used in uses {
            if used == module {
                continue;
            }
            match layer_of(&used) {
                Some(used_layer) if used_layer < layer => {}
                Some(used_layer) => violations.push(format!(
                    "{}: `{module}` (layer {layer}) uses `{used}` (layer {used_layer})",
                    shown.display()
                )),
                None => violations.push(format!(
                    "{}: `{module}` uses `{used}`, which is in no layer of LAYERS",
                    shown.display()
                )),
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

/// The binaries parse, call and print: every JSON object they print is a document of
/// `runjournal::json`, so neither builds one of its own with `json!`.
#[test]
fn the_binaries_build_no_json_object_of_their_own() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    let mut pending = vec![root.join("src/bin"), root.join("journal-tools/src")];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("a source directory reads") {
            let path = entry.expect("an entry reads").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                let text = std::fs::read_to_string(&path).expect("a source file reads");
                for (number, line) in text.lines().enumerate() {
                    if line.contains("json!") {
                        found.push(format!("{}:{}", path.display(), number + 1));
                    }
                }
            }
        }
    }
    assert!(found.is_empty(), "json! in the binaries: {found:?}");
}

/// The journal's folders, lowest first: a file of one uses only the folders before its own
/// (through `crate::journal::<folder>::…`) and the files of its own folder (through `super::`).
const JOURNAL_LAYERS: &[&str] = &["format", "file", "read", "write", "share", "handle"];

/// Each `crate::journal::<folder>[::<file>]` in `code`, as (folder, file), the file empty when
/// the path names only the folder or an item of its `mod.rs`.
fn journal_paths(code: &str) -> Vec<(String, String)> {
    let identifier = |text: &str| -> String {
        text.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::journal::") {
        rest = &rest[at + "crate::journal::".len()..];
        let folder = identifier(rest);
        let after = &rest[folder.len()..];
        let file = after.strip_prefix("::").map(identifier).unwrap_or_default();
        out.push((folder, file));
    }
    out
}

/// A file's code without its `//` comments and without its inline `#[cfg(test)] mod tests`
/// (tests may reach anywhere).
fn production_code_of(text: &str) -> String {
    let end = text.find("#[cfg(test)]\nmod tests").unwrap_or(text.len());
    code_of(&text[..end])
}

#[test]
fn the_journals_folders_form_layers_and_no_two_of_its_files_use_each_other() {
    let journal = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/journal");
    let mut files = Vec::new();
    source_files(&journal, &mut files);
    files.sort();
    let mut violations = Vec::new();
    // (folder/file) -> the journal files it uses, for the circle check.
    let mut uses: std::collections::BTreeMap<String, BTreeSet<String>> = Default::default();
    for file in &files {
        let relative = file.strip_prefix(&journal).expect("under src/journal");
        let parts: Vec<&str> = relative
            .iter()
            .map(|part| part.to_str().expect("a UTF-8 path"))
            .collect();
        if parts.contains(&"tests") || parts.contains(&"tests.rs") {
            continue;
        }
        let [folder, name] = parts.as_slice() else {
            if parts != ["mod.rs"] {
                violations.push(format!(
                    "{}: every journal file lives in a folder",
                    relative.display()
                ));
            }
            continue;
        };
        let name = name.strip_suffix(".rs").unwrap_or(name);
        let Some(layer) = JOURNAL_LAYERS.iter().position(|known| known == folder) else {
            violations.push(format!(
                "src/journal/{folder}: a folder not in JOURNAL_LAYERS"
            ));
            continue;
        };
        let me = format!("{folder}/{name}");
        let code = production_code_of(&std::fs::read_to_string(file).expect("a source file reads"));
        if code.contains("super::super::") {
            violations.push(format!("{me}: names another folder through super::super"));
        }
        let used = uses.entry(me.clone()).or_default();
        for (used_folder, used_file) in journal_paths(&code) {
            match JOURNAL_LAYERS.iter().position(|known| *known == used_folder) {
                Some(used_layer) if used_layer < layer || (used_layer == layer && !used_file.is_empty()) => {
                    if !used_file.is_empty() {
                        used.insert(format!("{used_folder}/{used_file}"));
                    }
                }
                Some(_) => violations.push(format!(
                    "{me}: `{folder}` uses `{used_folder}`, which is not below it"
                )),
                None => violations.push(format!(
                    "{me}: uses `crate::journal::{used_folder}`, a re-export or no folder: name the folder that owns it"
                )),
            }
        }
        if name != "mod" {
            let mut rest = code.as_str();
            while let Some(at) = rest.find("super::") {
                let is_path_start = rest[..at]
                    .chars()
                    .next_back()
                    .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'));
                rest = &rest[at + "super::".len()..];
                let sibling: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if is_path_start
                    && sibling
                        .chars()
                        .next()
                        .is_some_and(|c| c.is_ascii_lowercase())
                {
                    used.insert(format!("{folder}/{sibling}"));
                }
            }
        }
    }
    assert!(uses.len() > 20, "found only {} journal files", uses.len());
    // No circle among the files: a depth-first walk meets no file twice on one path.
    fn walk(
        at: &str,
        uses: &std::collections::BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        circles: &mut Vec<String>,
    ) {
        if let Some(start) = path.iter().position(|seen| seen == at) {
            circles.push(format!("{} -> {at}", path[start..].join(" -> ")));
            return;
        }
        if !done.insert(at.to_string()) {
            return;
        }
        path.push(at.to_string());
        for next in uses.get(at).into_iter().flatten() {
            walk(next, uses, path, done, circles);
        }
        path.pop();
    }
    let mut circles = Vec::new();
    let mut done = BTreeSet::new();
    for start in uses.keys() {
        walk(start, &uses, &mut Vec::new(), &mut done, &mut circles);
    }
    violations.extend(
        circles
            .into_iter()
            .map(|circle| format!("a circle: {circle}")),
    );
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn the_journal_path_scanner_reads_folder_and_file() {
    let found = journal_paths(&code_of(
        "use crate::journal::format::error::X;\nuse crate::journal::Journal; // crate::journal::file",
    ));
    assert_eq!(
        found,
        [
            ("format".to_string(), "error".to_string()),
            ("Journal".to_string(), String::new()),
        ]
    );
}

/// A circle among `uses` (file → the files it uses), as the files around it; `None` when
/// there is none.
fn find_circle(uses: &std::collections::BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        file: &str,
        uses: &std::collections::BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|seen| seen == file) {
            let mut circle = path[at..].to_vec();
            circle.push(file.to_string());
            return Some(circle);
        }
        if done.contains(file) {
            return None;
        }
        path.push(file.to_string());
        for used in uses.get(file).into_iter().flatten() {
            if let Some(circle) = visit(used, uses, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(file.to_string());
        None
    }
    let mut done = BTreeSet::new();
    uses.keys()
        .find_map(|file| visit(file, uses, &mut Vec::new(), &mut done))
}

#[test]
fn a_circle_between_files_is_found_and_a_chain_is_not() {
    let map = |edges: &[(&str, &str)]| {
        let mut uses = std::collections::BTreeMap::<String, BTreeSet<String>>::new();
        for (from, to) in edges {
            uses.entry(from.to_string())
                .or_default()
                .insert(to.to_string());
        }
        uses
    };
    assert_eq!(
        find_circle(&map(&[("inspect", "launch"), ("launch", "output")])),
        None
    );
    assert_eq!(
        find_circle(&map(&[
            ("inspect", "launch"),
            ("launch", "reconcile"),
            ("reconcile", "launch"),
        ])),
        Some(vec![
            "launch".to_string(),
            "reconcile".to_string(),
            "launch".to_string()
        ])
    );
}

/// Inside each binary, the files beside its root (`main.rs`, which declares them, dispatches to
/// them and holds what they all share: printing, exit codes, opening the home) use one another
/// without a circle: a command's file never needs a file that needs it back.
#[test]
fn no_file_of_a_binary_is_in_a_circle_with_another() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for dir in [
        root.join("src/bin/runjournal"),
        root.join("journal-tools/src"),
    ] {
        let mut files = BTreeSet::new();
        for entry in std::fs::read_dir(&dir).expect("a binary's directory reads") {
            let path = entry.expect("an entry reads").path();
            if let Some(stem) = path
                .file_name()
                .and_then(|name| name.to_str())
                .and_then(|name| name.strip_suffix(".rs"))
                .filter(|stem| *stem != "main")
            {
                files.insert(stem.to_string());
            }
        }
        assert!(files.len() >= 4, "{}: found {files:?}", dir.display());
        let mut uses = std::collections::BTreeMap::new();
        for file in &files {
            let text = std::fs::read_to_string(dir.join(format!("{file}.rs")))
                .expect("a source file reads");
            let used: BTreeSet<String> = crate_paths(&code_of(&text))
                .into_iter()
                .filter(|used| used != file && files.contains(used))
                .collect();
            uses.insert(file.clone(), used);
        }
        assert_eq!(find_circle(&uses), None, "{}: {uses:?}", dir.display());
    }
}
