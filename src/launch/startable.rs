//! What a launch checks before it creates a run: that its steps could start at all — the
//! working directory exists and is a directory, and every program a step runs is found where
//! the runner will look for it. A run that cannot start is refused at launch, naming what is
//! missing, and nothing is written; it used to be created and fail at its first step with
//! "No such file or directory", which read like a missing program whatever was missing.
//!
//! The programs are looked up as the runner's spawn does: a name with a `/` as a path (from
//! the step's working directory), any other in the directories of the run's `PATH`. That
//! `PATH` is the launcher's own (the runner inherits its environment), read in one place,
//! [`launcher_search_path`], so that a run's recorded environment can take its place.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::event::{RunSpec, StepAction};

/// What `execvp` searches when there is no `PATH` at all.
const DEFAULT_SEARCH_PATH: &str = "/bin:/usr/bin";

/// Why a run cannot start. Nothing was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Unstartable {
    #[error(
        "the run's working directory {} does not exist: create it, or give another as the spec's cwd",
        cwd.display()
    )]
    NoCwd { cwd: PathBuf },
    #[error(
        "the run's working directory {} is not a directory: give a directory as the spec's cwd",
        cwd.display()
    )]
    CwdNotADirectory { cwd: PathBuf },
    #[error("the run's working directory {} cannot be used: {source}", cwd.display())]
    CwdUnusable {
        cwd: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "step {step} ({name}): program {program:?} is not found on the run's PATH ({path}): install it, or name it by its path"
    )]
    NotOnPath {
        step: usize,
        name: String,
        program: String,
        path: String,
    },
    #[error(
        "step {step} ({name}): program {} is not an executable file",
        program.display()
    )]
    NotExecutable {
        step: usize,
        name: String,
        program: PathBuf,
    },
}

/// The `PATH` a run's steps are looked up in: the launcher's, which its runner inherits.
pub fn launcher_search_path() -> Option<OsString> {
    std::env::var_os("PATH")
}

/// Checks that `spec`'s steps can start: its working directory (relative to `launcher_cwd`,
/// as the runner, started there, resolves it) and every step's program, a name with a `/`
/// from that directory and any other in `search_path` (`None`: no `PATH`, as `execvp`
/// searches then). Shell and external-job steps run `sh`.
pub fn check_startable(
    spec: &RunSpec,
    search_path: Option<&OsStr>,
    launcher_cwd: &Path,
) -> Result<(), Unstartable> {
    let cwd = match &spec.cwd {
        Some(cwd) => {
            let cwd = launcher_cwd.join(cwd);
            match std::fs::metadata(&cwd) {
                Ok(metadata) if metadata.is_dir() => cwd,
                Ok(_) => return Err(Unstartable::CwdNotADirectory { cwd }),
                Err(error) if error.kind() == io::ErrorKind::NotFound => {
                    return Err(Unstartable::NoCwd { cwd });
                }
                Err(source) => return Err(Unstartable::CwdUnusable { cwd, source }),
            }
        }
        None => launcher_cwd.to_path_buf(),
    };
    let search_path = search_path.unwrap_or(OsStr::new(DEFAULT_SEARCH_PATH));
    for (step, spec) in spec.steps.iter().enumerate() {
        let program = match &spec.action {
            StepAction::Command { argv } => argv.first().map_or("", String::as_str),
            StepAction::Shell { .. } | StepAction::ExternalJob { .. } => "sh",
        };
        if program.contains('/') {
            let path = cwd.join(program);
            if !is_executable_file(&path) {
                return Err(Unstartable::NotExecutable {
                    step,
                    name: spec.name.clone(),
                    program: path,
                });
            }
        } else if find_on_path(program, search_path, &cwd).is_none() {
            return Err(Unstartable::NotOnPath {
                step,
                name: spec.name.clone(),
                program: program.to_string(),
                path: search_path.to_string_lossy().into_owned(),
            });
        }
    }
    Ok(())
}

/// Where `program` is found in `search_path`, as `execvp` looks: each directory in order, an
/// empty one meaning the working directory `cwd`.
fn find_on_path(program: &str, search_path: &OsStr, cwd: &Path) -> Option<PathBuf> {
    if program.is_empty() {
        return None;
    }
    search_path
        .as_bytes()
        .split(|&byte| byte == b':')
        .map(|dir| match dir {
            b"" => cwd.to_path_buf(),
            dir => cwd.join(Path::new(OsStr::from_bytes(dir))),
        })
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable_file(candidate))
}

/// A regular file (through links) that this process may execute.
fn is_executable_file(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|metadata| metadata.is_file())
        && nix::unistd::access(path, nix::unistd::AccessFlags::X_OK).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Mode;
    use crate::testkit as kit;

    fn spec_in(cwd: Option<&str>, action: StepAction) -> RunSpec {
        RunSpec {
            cwd: cwd.map(str::to_string),
            ..kit::spec(Mode::Single, vec![kit::step("only", action)])
        }
    }

    #[test]
    fn a_missing_or_non_directory_cwd_is_named() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("a-file");
        std::fs::write(&file, b"").expect("write");
        let path = Some(OsStr::new("/bin:/usr/bin"));
        let missing = spec_in(Some("gone/away"), kit::argv(&["true"]));
        match check_startable(&missing, path, dir.path()) {
            Err(Unstartable::NoCwd { cwd }) => assert_eq!(cwd, dir.path().join("gone/away")),
            other => panic!("{other:?}"),
        }
        let not_dir = spec_in(Some("a-file"), kit::argv(&["true"]));
        let error = check_startable(&not_dir, path, dir.path()).expect_err("a file");
        assert!(
            error.to_string().contains("a-file") && error.to_string().contains("not a directory"),
            "{error}"
        );
        let here = spec_in(Some("."), kit::argv(&["true"]));
        check_startable(&here, path, dir.path()).expect("a directory");
    }

    #[test]
    fn a_program_is_found_on_the_path_or_by_its_path_or_named_missing() {
        let dir = tempfile::tempdir().expect("temp dir");
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).expect("mkdir");
        let tool = bin.join("my-tool");
        std::fs::write(&tool, b"#!/bin/sh\n").expect("write");
        let path = OsString::from(format!("/nonexistent:{}", bin.display()));
        let found = spec_in(None, kit::argv(&["my-tool", "--flag"]));
        // Not executable yet.
        assert!(matches!(
            check_startable(&found, Some(&path), dir.path()),
            Err(Unstartable::NotOnPath { .. })
        ));
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        check_startable(&found, Some(&path), dir.path()).expect("found on PATH");
        let by_path = spec_in(None, kit::argv(&["bin/my-tool"]));
        check_startable(&by_path, Some(OsStr::new("")), dir.path()).expect("found by its path");
        let missing = spec_in(None, kit::argv(&["no-such-program-here"]));
        let error = check_startable(&missing, Some(&path), dir.path()).expect_err("missing");
        let text = error.to_string();
        assert!(
            text.contains("\"no-such-program-here\"") && text.contains("/nonexistent"),
            "{text}"
        );
        let shell = spec_in(None, kit::sh("true"));
        assert!(
            matches!(
                check_startable(&shell, Some(&path), dir.path()),
                Err(Unstartable::NotOnPath { program, .. }) if program == "sh"
            ),
            "a shell step needs sh on the PATH"
        );
        check_startable(&shell, None, dir.path()).expect("sh is where execvp looks by default");
    }
}
