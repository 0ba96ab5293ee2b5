//! What a test that acts as another user gives that user to work with. A process of another
//! uid can neither execute a program nor enter a directory that lies under a directory only
//! its owner may enter — a clone kept in a 0700 home, a `mktemp -d`, a private `$TMPDIR` —
//! so such a test never hands it a path of the build tree: it copies what that user must
//! execute ([`ReachableCopy`]), and makes what that user must write in ([`reachable_dir`]),
//! under a temporary directory every user can reach.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Whether every user may reach `dir`: it and each directory above it may be searched by
/// others.
fn is_reachable_by_all(dir: &Path) -> bool {
    dir.ancestors().all(|ancestor| {
        std::fs::metadata(ancestor)
            .is_ok_and(|metadata| metadata.is_dir() && metadata.permissions().mode() & 0o001 != 0)
    })
}

/// A fresh, empty directory (0755, this user's) that every user can reach: under the
/// temporary directory when every user can reach that, else under `/tmp`.
pub fn reachable_dir() -> tempfile::TempDir {
    let temp = std::env::temp_dir();
    let parent = if is_reachable_by_all(&temp) {
        temp
    } else {
        PathBuf::from("/tmp")
    };
    assert!(
        is_reachable_by_all(&parent),
        "no temporary directory every user can reach ({} is not)",
        parent.display()
    );
    let dir = tempfile::Builder::new()
        .prefix("runjournal-reachable-")
        .tempdir_in(&parent)
        .expect("a temporary directory");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod 755 the reachable directory");
    dir
}

/// A copy of a program that every user can execute; removed on drop.
pub struct ReachableCopy {
    dir: tempfile::TempDir,
    path: PathBuf,
}

impl ReachableCopy {
    /// Copies `program` (mode 0755) into a fresh [`reachable_dir`].
    pub fn of(program: &Path) -> ReachableCopy {
        let dir = reachable_dir();
        let name = program.file_name().expect("a program has a file name");
        let path = dir.path().join(name);
        std::fs::copy(program, &path)
            .unwrap_or_else(|error| panic!("copy {}: {error}", program.display()));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .expect("chmod 755 the copy");
        ReachableCopy { dir, path }
    }

    /// Where the copy is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory it is in, which every user can reach (and write nothing in).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}
