//! ARCHITECTURE.md is a map of the code, and a map is only worth reading while it is true and
//! short. This test reads it and checks every name it gives in backticks:
//!
//! * a path (it has a `/`: `src/journal/share/`, `.ci/run`) exists in the repository;
//! * a file name (`main.rs`, `eio_shim.c`) is the name of some file of the repository;
//! * a module path (`journal::share`, `runner::outcome::TABLE`) starts at a module of the
//!   library and each part is a module below it or an item that module defines; a path that
//!   starts at a crate the package depends on is someone else's and left alone;
//! * the names in the code map's headings and in the layers table are modules of the library,
//!   and every module of the library has its heading.
//!
//! And the file is under [`MAX_BYTES`]. Spans that are neither (types, commands, flags, file
//! names of a home at run time such as `status.json`) are not checked.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The map's size limit: past it, it is no longer a map.
const MAX_BYTES: usize = 32 * 1024;

/// What the map is checked against: the repository's root, its files' names, the library's
/// top-level modules and the crates the package depends on.
struct Repo {
    root: PathBuf,
    file_names: BTreeSet<String>,
    modules: BTreeSet<String>,
    externals: BTreeSet<String>,
}

impl Repo {
    fn this() -> Repo {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let mut file_names = BTreeSet::new();
        collect_file_names(&root, &mut file_names);
        let lib = read(&root.join("src/lib.rs"));
        let modules = lib
            .lines()
            .filter_map(|line| {
                let line = line.trim();
                let rest = line
                    .strip_prefix("pub mod ")
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
        Repo {
            root,
            file_names,
            modules,
            externals,
        }
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

fn collect_file_names(dir: &Path, out: &mut BTreeSet<String>) {
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
            if name != "target" && name != ".git" {
                collect_file_names(&path, out);
            }
        } else {
            out.insert(name);
        }
    }
}

/// Every backticked span of `text` outside fenced blocks, with its line and whether that line
/// is one whose spans must all be modules (a code-map heading or a row of the layers table).
fn spans(text: &str) -> Vec<(usize, String, bool)> {
    let mut out = Vec::new();
    let mut in_fence = false;
    let mut section = "";
    for (index, line) in text.lines().enumerate() {
        if line.starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        if let Some(title) = line.strip_prefix("## ") {
            section = title;
        }
        let must_be_modules = (section == "Code map" && line.starts_with("### "))
            || (section == "Layers" && line.starts_with('|'));
        for (at, piece) in line.split('`').enumerate() {
            if at % 2 == 1 && !piece.is_empty() {
                out.push((index + 1, piece.to_string(), must_be_modules));
            }
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

/// Every problem of `text` as a map of `repo`, one line each.
fn problems(repo: &Repo, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    if text.len() >= MAX_BYTES {
        out.push(format!(
            "the map is {} bytes, not under {MAX_BYTES}",
            text.len()
        ));
    }
    let is_plain = |span: &str| {
        !span.starts_with(['/', '-', '$', '~'])
            && !span.contains(|c: char| c.is_whitespace() || "<>*=(){}[]\"'|,@%".contains(c))
    };
    let mut headed = BTreeSet::new();
    for (line, span, must_be_module) in spans(text) {
        if must_be_module {
            if repo.modules.contains(&span) {
                headed.insert(span.clone());
            } else {
                out.push(format!(
                    "line {line}: `{span}` is not a module of the library"
                ));
            }
            continue;
        }
        if !is_plain(&span) {
            continue;
        }
        if span.contains('/') {
            if !repo.root.join(span.trim_end_matches('/')).exists() {
                out.push(format!(
                    "line {line}: `{span}` is not a path of the repository"
                ));
            }
        } else if [".rs", ".md", ".toml", ".c", ".mjs", ".lock"]
            .iter()
            .any(|extension| span.ends_with(extension))
        {
            if !repo.file_names.contains(&span) {
                out.push(format!(
                    "line {line}: `{span}` is the name of no file of the repository"
                ));
            }
        } else if span.contains("::") {
            let parts: Vec<&str> = span.split("::").collect();
            let first = parts[0];
            let is_module_path = parts.iter().all(|part| is_identifier(part))
                && first.starts_with(|c: char| c.is_ascii_lowercase());
            if !is_module_path || repo.externals.contains(first) {
                continue;
            }
            if let Some(problem) = module_path_problem(repo, &span) {
                out.push(format!("line {line}: `{span}`: {problem}"));
            }
        }
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

#[test]
fn every_name_in_architecture_md_exists_and_the_map_is_short() {
    let repo = Repo::this();
    assert!(repo.modules.len() > 20, "found only {:?}", repo.modules);
    assert!(repo.externals.contains("redb"), "{:?}", repo.externals);
    let text = read(&repo.root.join("ARCHITECTURE.md"));
    let found = problems(&repo, &text);
    assert!(found.is_empty(), "ARCHITECTURE.md:\n{}", found.join("\n"));
    // The map names enough for the check to mean something.
    let checked = spans(&text)
        .into_iter()
        .filter(|(_, span, _)| span.contains('/') || span.contains("::"))
        .count();
    assert!(
        checked > 40,
        "only {checked} paths and module paths checked"
    );
}

#[test]
fn a_made_up_path_file_module_or_item_is_caught() {
    let repo = Repo::this();
    let heading = |module: &str| format!("## Code map\n### `{module}`\n");
    let all_headings: String = repo.modules.iter().map(|module| heading(module)).collect();
    let real = format!(
        "## Layers\n| a | `event`, `journal` |\n{all_headings}\
         `src/journal/share/` `.ci/run` `main.rs` `journal::share` `runner::outcome::TABLE` \
         `state::apply` `show::RunView` `redb::Durability` `status.json` `RunSpec::check`\n"
    );
    assert_eq!(problems(&repo, &real), Vec::<String>::new());
    let made_up = [
        "`src/journal/nowhere.rs`",
        "`tests/it/no_such_test.rs`",
        "`no_such_file.rs`",
        "`journal::no_such_part`",
        "`runner::outcome::NO_SUCH_TABLE`",
        "`nomodule::thing`",
    ];
    for name in made_up {
        let found = problems(&repo, &format!("{real}{name}\n"));
        assert_eq!(found.len(), 1, "{name}: {found:?}");
        assert!(found[0].contains(name), "{name}: {found:?}");
    }
    let in_heading = problems(&repo, &format!("{real}### `nomodule`\n"));
    assert!(
        in_heading
            .iter()
            .any(|problem| problem.contains("`nomodule`")),
        "{in_heading:?}"
    );
    let in_layers = problems(&repo, &format!("## Layers\n| x | `nomodule` |\n{real}"));
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
    let missing = problems(&repo, &without_event);
    assert_eq!(
        missing,
        ["module `event` has no heading in the code map"],
        "a module left out of the code map"
    );
    let long = format!("{real}{}", "x".repeat(MAX_BYTES));
    assert!(
        problems(&repo, &long)
            .iter()
            .any(|problem| problem.contains("not under")),
        "a map past the limit"
    );
}
