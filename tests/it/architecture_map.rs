//! The docs name the code, and a name that no longer exists sends a reader nowhere. This test
//! reads README.md, ARCHITECTURE.md, every page of `docs/` and fuzz/README.md, and checks each
//! name they give in backticks, outside fenced blocks:
//!
//! * a path of the repository (`src/journal/share/`, `.ci/run`: its first part is a top-level
//!   entry of the repository, or it names a source file) exists;
//! * a file name (`main.rs`, `eio_shim.c`) is the name of some file of the repository;
//! * a module path (`journal::share`, `runner::outcome::TABLE`) starts at a module of the
//!   library and each part is a module below it or an item that module defines; one that starts
//!   at an integration test's file (`power_cut::a_failed_open_...`) names a function of that
//!   file; one that starts at a crate the package depends on is someone else's and left alone;
//! * a type's member (`RunSpec::check`, `CommitSharing::Alone`), when the type is defined in
//!   the repository, is a function, a variant or a field there;
//! * a name in snake case (`reconcile_before_reading`, `log_floor`) occurs in the sources, and
//!   one of four words or more (a test's name) is a function of them;
//! * an environment variable of ours (`RUNJOURNAL_...`, `JOURNAL_TOOLS_...`) is read somewhere;
//!
//! and every relative link (`[the design](docs/design.md#reconciler)`) reaches a file, and a
//! heading of it when it names one. ARCHITECTURE.md is also a map of the library: the names in
//! its code map's headings and in its layers table are modules, and every module has its
//! heading. The README is a page (under [`README_MAX_BYTES`]) and the map is short (under
//! [`MAP_MAX_BYTES`]). Spans that are none of these (types alone, commands, flags, files of a
//! home at run time such as `status.json`) are not checked.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};

/// The map's size limit: past it, it is no longer a map.
const MAP_MAX_BYTES: usize = 32 * 1024;

/// The README's size limit: a newcomer reads it in five minutes; the manual is in `docs/`.
const README_MAX_BYTES: usize = 16 * 1024;

/// The extensions of the files whose words count as the sources.
const SOURCE_EXTENSIONS: [&str; 5] = ["rs", "c", "mjs", "sh", "toml"];

/// What the docs are checked against: the repository's root, its files' names, the library's
/// top-level modules, the crates the package depends on, and the words of its sources.
struct Repo {
    root: PathBuf,
    top_level: BTreeSet<String>,
    file_names: BTreeSet<String>,
    modules: BTreeSet<String>,
    externals: BTreeSet<String>,
    /// Every identifier that occurs in a source file.
    words: HashSet<String>,
    /// Every name defined by `fn` in a Rust file.
    functions: HashSet<String>,
    /// Every name defined in a Rust file by `fn`, `const`, `static`, `struct`, `enum`, `trait`,
    /// `type` or `mod`.
    items: HashSet<String>,
    /// The Rust files (indexes into `rust`) that define each type: `struct`, `enum`, `trait`
    /// or `type`.
    types: BTreeMap<String, Vec<usize>>,
    /// The integration tests' files by module name (`power_cut`: `tests/it/power_cut.rs`).
    test_files: BTreeMap<String, Vec<PathBuf>>,
    /// Rust source files with their text.
    rust: Vec<(PathBuf, String)>,
}

impl Repo {
    fn this() -> Repo {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        collect_files(&root, &mut files);
        let file_names = files
            .iter()
            .filter_map(|path| path.file_name()?.to_str().map(String::from))
            .collect();
        let top_level = std::fs::read_dir(&root)
            .unwrap_or_else(|error| panic!("{}: {error}", root.display()))
            .filter_map(|entry| entry.ok()?.file_name().to_str().map(String::from))
            .filter(|name| name != "target" && name != ".git")
            .collect();
        let lib = read(&root.join("src/lib.rs"));
        let modules = lib
            .lines()
            .filter_map(|line| {
                let line = line.trim();
                let rest = line
                    .strip_prefix("pub mod ")
                    .or_else(|| line.strip_prefix("pub(crate) mod "))
                    .or_else(|| line.strip_prefix("mod "))?;
                Some(rest.trim_end_matches(';').trim().to_string())
            })
            .collect();
        let mut externals: BTreeSet<String> = ["std", "core", "alloc"]
            .into_iter()
            .map(String::from)
            .collect();
        let mut in_dependencies = false;
        for line in read(&root.join("Cargo.toml")).lines() {
            let line = line.trim();
            if line.starts_with('[') {
                in_dependencies = line.contains("dependencies");
            } else if let Some((name, _)) = line.split_once('=')
                && in_dependencies
                && !line.starts_with('#')
            {
                externals.insert(name.trim().replace('-', "_"));
            }
        }
        let mut words = HashSet::new();
        let mut functions = HashSet::new();
        let mut items = HashSet::new();
        let mut types: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        let mut test_files: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
        let mut rust = Vec::new();
        for path in &files {
            let relative = path.strip_prefix(&root).unwrap_or(path);
            let is_source = path
                .extension()
                .and_then(|extension| extension.to_str())
                .is_some_and(|extension| SOURCE_EXTENSIONS.contains(&extension))
                || relative == Path::new(".ci/run");
            // This file names made-up names on purpose: they are not the sources'.
            let is_this_test = relative == Path::new("tests/it/architecture_map.rs");
            if !is_source || is_this_test || relative.starts_with("fuzz/corpus") {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(path) else {
                continue;
            };
            let is_rust = path.extension().is_some_and(|extension| extension == "rs");
            let mut previous = "";
            for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if word.is_empty() {
                    continue;
                }
                if is_rust {
                    if previous == "fn" {
                        functions.insert(word.to_string());
                    }
                    if [
                        "fn", "const", "static", "struct", "enum", "trait", "type", "mod",
                    ]
                    .contains(&previous)
                    {
                        items.insert(word.to_string());
                    }
                    if ["struct", "enum", "trait", "type"].contains(&previous) {
                        let files = types.entry(word.to_string()).or_default();
                        if files.last() != Some(&rust.len()) {
                            files.push(rust.len());
                        }
                    }
                }
                words.insert(word.to_string());
                previous = word;
            }
            if is_rust {
                let in_tests = relative
                    .components()
                    .any(|component| component.as_os_str() == "tests");
                if in_tests && let Some(stem) = path.file_stem().and_then(|stem| stem.to_str()) {
                    test_files
                        .entry(stem.to_string())
                        .or_default()
                        .push(path.clone());
                }
                rust.push((path.clone(), text));
            }
        }
        Repo {
            root,
            top_level,
            file_names,
            modules,
            externals,
            words,
            functions,
            items,
            types,
            test_files,
            rust,
        }
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|error| panic!("{}: {error}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        let name = path
            .file_name()
            .and_then(|name| name.to_str())
            .unwrap_or_default()
            .to_string();
        if path.is_dir() {
            if name != "target" && name != ".git" && name != "node_modules" {
                collect_files(&path, out);
            }
        } else {
            out.push(path);
        }
    }
}

/// A doc to check: its path from the repository's root, and its text.
struct Doc {
    path: PathBuf,
    text: String,
}

/// The docs this test holds to the code.
fn docs(repo: &Repo) -> Vec<Doc> {
    let mut paths = vec![
        PathBuf::from("README.md"),
        PathBuf::from("ARCHITECTURE.md"),
        PathBuf::from("fuzz/README.md"),
    ];
    let mut pages: Vec<PathBuf> = std::fs::read_dir(repo.root.join("docs"))
        .expect("docs/ reads")
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let is_page = path.extension().is_some_and(|extension| extension == "md");
            let name = path.file_name()?;
            is_page.then(|| PathBuf::from("docs").join(name))
        })
        .collect();
    pages.sort();
    paths.extend(pages);
    paths
        .into_iter()
        .map(|path| Doc {
            text: read(&repo.root.join(&path)),
            path,
        })
        .collect()
}

/// Every backticked span of `text` outside fenced blocks, with the line it starts on and
/// whether that line is one whose spans must all be modules (a code-map heading or a row of the
/// layers table of ARCHITECTURE.md). A span may go on over a line's end, as in a paragraph; a
/// blank line ends it.
fn spans(text: &str, is_map: bool) -> Vec<(usize, String, bool)> {
    let mut out = Vec::new();
    let mut in_fence = false;
    let mut section = "";
    let mut open: Option<(usize, String, bool)> = None;
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            open = None;
            continue;
        }
        if in_fence {
            continue;
        }
        if line.trim().is_empty() {
            open = None;
            continue;
        }
        if let Some(title) = line.strip_prefix("## ") {
            section = title;
        }
        let must_be_modules = is_map
            && ((section == "Code map" && line.starts_with("### "))
                || (section == "Layers" && line.starts_with('|')));
        for (at, piece) in line.split('`').enumerate() {
            if at > 0 {
                // A backtick: it closes the open span, or opens one.
                match open.take() {
                    Some((start, span, modules)) => {
                        if !span.is_empty() {
                            out.push((start, span, modules));
                        }
                    }
                    None => open = Some((index + 1, String::new(), must_be_modules)),
                }
            }
            if let Some((_, span, _)) = &mut open {
                if at == 0 && !span.is_empty() {
                    span.push(' ');
                }
                span.push_str(piece);
            }
        }
    }
    out
}

/// Every relative link of `text` outside fenced blocks and code spans, with its line.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_fence = false;
    let mut in_code = false;
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            in_code = false;
            continue;
        }
        if in_fence {
            continue;
        }
        if line.trim().is_empty() {
            in_code = false;
            continue;
        }
        let mut prose = String::new();
        for (at, piece) in line.split('`').enumerate() {
            if at > 0 {
                in_code = !in_code;
            }
            if !in_code {
                prose.push_str(piece);
                prose.push(' ');
            }
        }
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else {
                break;
            };
            let target = &rest[..end];
            rest = &rest[end..];
            if !target.contains("://") && !target.starts_with("mailto:") {
                out.push((index + 1, target.to_string()));
            }
        }
    }
    out
}

/// The anchor a heading gets on the page: lower case, spaces as hyphens, no punctuation but
/// hyphens and underscores.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a page's headings, outside fenced blocks.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut in_fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if !in_fence && line.starts_with('#') {
            out.insert(slug(line.trim_start_matches('#')));
        }
    }
    out
}

fn is_identifier(text: &str) -> bool {
    !text.is_empty()
        && !text.starts_with(|c: char| c.is_ascii_digit())
        && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The files of a module, given the path of its file without `.rs` (`src/journal/append`):
/// its own file, or its `mod.rs`, and every file in its directory.
fn module_files(base: &Path) -> Option<Vec<PathBuf>> {
    let file = base.with_extension("rs");
    let mut files = Vec::new();
    if file.is_file() {
        files.push(file);
    } else if !base.join("mod.rs").is_file() {
        return None;
    }
    if base.is_dir() {
        let mut stack = vec![base.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("a module directory reads") {
                let path = entry.expect("a directory entry").path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|extension| extension == "rs") {
                    files.push(path);
                }
            }
        }
    }
    Some(files)
}

/// Whether `code` defines `name` (or re-exports it).
fn defines(code: &str, name: &str) -> bool {
    const KINDS: [&str; 10] = [
        "fn",
        "const",
        "static",
        "struct",
        "enum",
        "trait",
        "type",
        "mod",
        "union",
        "macro_rules!",
    ];
    let is_word_at = |line: &str, at: usize| {
        let after = &line[at + name.len()..];
        let before = &line[..at];
        !after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            && !before.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
    };
    code.lines().any(|line| {
        let line = line.trim_start();
        let Some(at) = line.find(name) else {
            return false;
        };
        if !is_word_at(line, at) {
            return false;
        }
        let before = line[..at].trim_end();
        KINDS.iter().any(|kind| before.ends_with(kind))
            || (line.contains("use ") && line.starts_with("pub"))
    })
}

/// Whether `code` has an enum variant or a field `name`: a line that starts with it (after
/// `pub`, for a field), then a field list, a comma, a colon or nothing.
fn has_member(code: &str, name: &str) -> bool {
    code.lines().any(|line| {
        let line = line.trim_start();
        let line = line
            .strip_prefix("pub(crate) ")
            .or_else(|| line.strip_prefix("pub "))
            .unwrap_or(line);
        line.strip_prefix(name)
            .is_some_and(|after| after.is_empty() || after.starts_with([' ', '{', '(', ',', ':']))
    })
}

/// Why a module path does not name something of the library, or `None` when it does.
fn module_path_problem(repo: &Repo, path: &str) -> Option<String> {
    let mut parts: Vec<&str> = path.split("::").collect();
    if parts.first() == Some(&"runjournal") {
        parts.remove(0);
    }
    let top = *parts.first()?;
    if !repo.modules.contains(top) {
        return Some(format!("`{top}` is not a module of the library"));
    }
    let mut base = repo.root.join("src").join(top);
    let mut files = module_files(&base)?;
    for part in &parts[1..] {
        if let Some(below) = module_files(&base.join(part)) {
            base = base.join(part);
            files = below;
            continue;
        }
        let code: String = files.iter().map(|file| read(file)).collect();
        if !defines(&code, part) {
            let module = base.strip_prefix(repo.root.join("src")).unwrap_or(&base);
            return Some(format!(
                "`{part}` is neither a module nor an item of `{}`",
                module.display()
            ));
        }
        // What follows an item (a variant, a method) is the item's own business.
        break;
    }
    None
}

/// Why `test_module::name` names no function of that test file, or `None` when it does.
fn test_path_problem(files: &[PathBuf], name: &str) -> Option<String> {
    let code: String = files.iter().map(|file| read(file)).collect();
    (!defines(&code, name)).then(|| format!("`{name}` is not a function of that test file"))
}

/// Why `Type::member` names nothing, or `None` when it does or the type is not ours: a member
/// is a variant or a field of the type, or a function or item of the sources.
fn member_problem(repo: &Repo, owner: &str, member: &str) -> Option<String> {
    let defining = repo.types.get(owner)?;
    let is_member = defining
        .iter()
        .any(|&index| has_member(&repo.rust[index].1, member));
    let is_item = repo.items.contains(member);
    (!is_member && !is_item).then(|| format!("`{owner}` has no `{member}`"))
}

/// Whether `span` is a name in snake case: lower-case letters, digits and underscores, with
/// at least one underscore.
fn is_snake_name(span: &str) -> bool {
    is_identifier(span)
        && span.contains('_')
        && span.starts_with(|c: char| c.is_ascii_lowercase())
        && span
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// Every problem of the names `doc` gives, one line each.
fn name_problems(repo: &Repo, doc: &Doc, is_map: bool) -> Vec<String> {
    let mut out = Vec::new();
    let is_plain = |span: &str| {
        !span.starts_with(['/', '-', '$', '~', '.'])
            && !span.contains(|c: char| c.is_whitespace() || "<>*=(){}[]\"'|,@%#&+;".contains(c))
    };
    let is_source_name = |span: &str| {
        [".rs", ".md", ".toml", ".c", ".mjs", ".sh"]
            .iter()
            .any(|extension| span.ends_with(extension))
    };
    for (line, span, must_be_module) in spans(&doc.text, is_map) {
        if must_be_module {
            if !repo.modules.contains(&span) {
                out.push(format!(
                    "line {line}: `{span}` is not a module of the library"
                ));
            }
            continue;
        }
        let span = span.trim_end_matches(['.', ':']).to_string();
        if span == ".ci/run" || span == ".ci/" {
            if !repo.root.join(&span).exists() {
                out.push(format!(
                    "line {line}: `{span}` is not a path of the repository"
                ));
            }
            continue;
        }
        // What a build or a run makes (`target/bench-report.md`) is not in the repository.
        if !is_plain(&span) || span.starts_with("target/") {
            continue;
        }
        if span.contains('/') {
            let first = span.split('/').next().unwrap_or_default();
            let is_repository_path = repo.top_level.contains(first) || is_source_name(&span);
            if is_repository_path && !repo.root.join(span.trim_end_matches('/')).exists() {
                out.push(format!(
                    "line {line}: `{span}` is not a path of the repository"
                ));
            }
        } else if is_source_name(&span) {
            if !repo.file_names.contains(&span) {
                out.push(format!(
                    "line {line}: `{span}` is the name of no file of the repository"
                ));
            }
        } else if span.contains("::") {
            let parts: Vec<&str> = span.split("::").collect();
            if !parts.iter().all(|part| is_identifier(part)) {
                continue;
            }
            let first = parts[0];
            if first.starts_with(|c: char| c.is_ascii_uppercase()) {
                if parts.len() == 2
                    && let Some(problem) = member_problem(repo, first, parts[1])
                {
                    out.push(format!("line {line}: `{span}`: {problem}"));
                }
                continue;
            }
            if repo.externals.contains(first) {
                continue;
            }
            // A module of the library, or a test file's function (`retention` names both).
            let as_module = repo
                .modules
                .contains(first)
                .then(|| module_path_problem(repo, &span));
            let as_test = repo
                .test_files
                .get(first)
                .map(|files| test_path_problem(files, parts[1]));
            let problem = match (as_module, as_test) {
                (Some(None), _) | (_, Some(None)) => None,
                (Some(Some(problem)), _) | (None, Some(Some(problem))) => Some(problem),
                (None, None) => module_path_problem(repo, &span),
            };
            if let Some(problem) = problem {
                out.push(format!("line {line}: `{span}`: {problem}"));
            }
        } else if is_snake_name(&span) {
            let is_test_name = span.matches('_').count() >= 3;
            if is_test_name && !repo.functions.contains(&span) {
                out.push(format!(
                    "line {line}: `{span}` is not a function (or test) of the repository"
                ));
            } else if !repo.words.contains(&span) {
                out.push(format!(
                    "line {line}: `{span}` occurs nowhere in the sources"
                ));
            }
        } else if (span.starts_with("RUNJOURNAL_") || span.starts_with("JOURNAL_TOOLS_"))
            && is_identifier(&span)
            && !repo.words.contains(&span)
        {
            out.push(format!(
                "line {line}: `{span}` is read nowhere in the sources"
            ));
        }
    }
    out
}

/// Every problem of the links `doc` gives, one line each.
fn link_problems(repo: &Repo, doc: &Doc) -> Vec<String> {
    let mut out = Vec::new();
    let dir = doc.path.parent().unwrap_or(Path::new(""));
    for (line, target) in links(&doc.text) {
        let (file, anchor) = match target.split_once('#') {
            Some((file, anchor)) => (file, Some(anchor)),
            None => (target.as_str(), None),
        };
        let path = if file.is_empty() {
            doc.path.clone()
        } else {
            normalize(&dir.join(file))
        };
        let full = repo.root.join(&path);
        if !file.is_empty() && !full.exists() {
            out.push(format!(
                "line {line}: the link to `{target}` reaches no file"
            ));
            continue;
        }
        let Some(anchor) = anchor else {
            continue;
        };
        let text = if file.is_empty() {
            doc.text.clone()
        } else {
            std::fs::read_to_string(&full).unwrap_or_default()
        };
        if !anchors(&text).contains(anchor) {
            out.push(format!(
                "line {line}: the link to `{target}` names no heading of {}",
                path.display()
            ));
        }
    }
    out
}

/// `a/b/../c` as `a/c`.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// What ARCHITECTURE.md must be besides: short, and a heading in its code map per module.
fn map_problems(repo: &Repo, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    if text.len() >= MAP_MAX_BYTES {
        out.push(format!(
            "the map is {} bytes, not under {MAP_MAX_BYTES}",
            text.len()
        ));
    }
    // The layers table lists every module, so only the code map's headings are counted here.
    let mut code_map_headings = BTreeSet::new();
    let mut section = "";
    for line in text.lines() {
        if let Some(title) = line.strip_prefix("## ") {
            section = title;
        }
        if section == "Code map" && line.starts_with("### ") {
            for (at, piece) in line.split('`').enumerate() {
                if at % 2 == 1 {
                    code_map_headings.insert(piece.to_string());
                }
            }
        }
    }
    for module in &repo.modules {
        if !code_map_headings.contains(module) {
            out.push(format!("module `{module}` has no heading in the code map"));
        }
    }
    out
}

/// Every problem of one doc, one line each.
fn problems(repo: &Repo, doc: &Doc) -> Vec<String> {
    let is_map = doc.path == Path::new("ARCHITECTURE.md");
    let mut out = name_problems(repo, doc, is_map);
    out.extend(link_problems(repo, doc));
    if is_map {
        out.extend(map_problems(repo, &doc.text));
    }
    if doc.path == Path::new("README.md") && doc.text.len() > README_MAX_BYTES {
        out.push(format!(
            "the README is {} bytes, over {README_MAX_BYTES}: move the manual to docs/",
            doc.text.len()
        ));
    }
    out
}

fn doc(path: &str, text: &str) -> Doc {
    Doc {
        path: PathBuf::from(path),
        text: text.to_string(),
    }
}

#[test]
fn every_name_and_link_in_the_docs_exists() {
    let repo = Repo::this();
    assert!(repo.modules.len() > 20, "found only {:?}", repo.modules);
    assert!(repo.externals.contains("redb"), "{:?}", repo.externals);
    let docs = docs(&repo);
    let mut found = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        for problem in problems(&repo, doc) {
            found.push(format!("{}: {problem}", doc.path.display()));
        }
        checked += spans(&doc.text, false)
            .into_iter()
            .filter(|(_, span, _)| span.contains('/') || span.contains("::"))
            .count();
    }
    assert!(found.is_empty(), "\n{}", found.join("\n"));
    // The docs name enough for the check to mean something, and every guide is read.
    assert!(docs.len() >= 10, "only {} docs read", docs.len());
    assert!(
        checked > 200,
        "only {checked} paths and module paths checked"
    );
}

#[test]
fn the_readme_is_a_page_and_the_map_is_short() {
    let repo = Repo::this();
    let readme = read(&repo.root.join("README.md"));
    assert!(
        readme.len() <= README_MAX_BYTES,
        "README.md is {} bytes, over {README_MAX_BYTES}",
        readme.len()
    );
    // The README's test command is the one CI runs.
    let ci = read(&repo.root.join(".ci/run"));
    assert!(
        ci.lines()
            .any(|line| line.trim() == "cargo test --workspace"),
        ".ci/run no longer runs `cargo test --workspace`"
    );
    assert!(
        readme
            .lines()
            .any(|line| line.trim() == "cargo test --workspace"),
        "README.md no longer gives `cargo test --workspace` as its test command"
    );
    let long = doc("README.md", &"x".repeat(README_MAX_BYTES + 1));
    assert!(
        problems(&repo, &long)
            .iter()
            .any(|problem| problem.contains("over")),
        "a README past the limit"
    );
}

#[test]
fn a_made_up_path_file_module_item_test_variable_or_link_is_caught() {
    let repo = Repo::this();
    let real = "`src/journal/share/` `.ci/run` `main.rs` `journal::share` \
        `runner::outcome::TABLE` `state::apply` `show::RunView` `redb::Durability` \
        `status.json` `RunSpec::check` `CommitSharing::Alone` `Durability::Immediate` \
        `power_cut::a_failed_open_never_removes_a_journal_another_process_created` \
        `a_reused_pid_is_dead` `log_floor` `RUNJOURNAL_LEADER_TIMEOUT` `runs/<id>/status.json` \
        `async-subagent-runs/.active-runs/` `runjournal/journal.redb` \
        `retention::prunes_killed_at_random_moments_leave_no_run_half_pruned_and_the_next_pass_finishes_them` \
        [the design](design.md#failures-and-guarantees) [the map](../ARCHITECTURE.md) \
        [up](#a-heading)\n# A heading\n";
    assert_eq!(
        problems(&repo, &doc("docs/guide.md", real)),
        Vec::<String>::new()
    );
    let made_up = [
        "`src/journal/nowhere.rs`",
        "`tests/it/no_such_test.rs`",
        "`docs/no-such-guide.md`",
        "`no_such_file.rs`",
        "`journal::no_such_part`",
        "`runner::outcome::NO_SUCH_TABLE`",
        "`nomodule::thing`",
        "`power_cut::no_such_test_of_power_cuts`",
        "`RunSpec::no_such_method`",
        "`a_test_that_was_never_written`",
        "`no_such_meta_key`",
        "`RUNJOURNAL_NO_SUCH_VARIABLE`",
        "[nowhere](no-such-guide.md)",
        "[no heading](design.md#no-such-heading)",
        "[no heading here](#no-such-heading)",
    ];
    for name in made_up {
        let found = problems(&repo, &doc("docs/guide.md", &format!("{real}{name}\n")));
        assert_eq!(found.len(), 1, "{name}: {found:?}");
        let cited = name.trim_matches('`');
        let cited = cited
            .split_once("](")
            .map_or(cited, |(_, target)| target.trim_end_matches(')'));
        assert!(found[0].contains(cited), "{name}: {found:?}");
    }
}

#[test]
fn the_map_names_only_modules_and_every_module_has_its_heading() {
    let repo = Repo::this();
    let heading = |module: &str| format!("## Code map\n### `{module}`\n");
    let all_headings: String = repo.modules.iter().map(|module| heading(module)).collect();
    let map = |text: &str| problems(&repo, &doc("ARCHITECTURE.md", text));
    let real = format!("## Layers\n| a | `event`, `journal` |\n{all_headings}");
    assert_eq!(map(&real), Vec::<String>::new());
    let in_heading = map(&format!("{real}### `nomodule`\n"));
    assert!(
        in_heading
            .iter()
            .any(|problem| problem.contains("`nomodule`")),
        "{in_heading:?}"
    );
    let in_layers = map(&format!("## Layers\n| x | `nomodule` |\n{real}"));
    assert!(
        in_layers
            .iter()
            .any(|problem| problem.contains("`nomodule`")),
        "{in_layers:?}"
    );
    let without_event: String = repo
        .modules
        .iter()
        .filter(|module| *module != "event")
        .map(|module| heading(module))
        .collect();
    assert_eq!(
        map(&without_event),
        ["module `event` has no heading in the code map"],
        "a module left out of the code map"
    );
    let long = format!("{real}{}", "x".repeat(MAP_MAX_BYTES));
    assert!(
        map(&long)
            .iter()
            .any(|problem| problem.contains("not under")),
        "a map past the limit"
    );
}
