//! Copies of repository directories, for tests that damage one and keep the other.

use std::fs;
use std::path::Path;

/// Copies the tree at `from` to `to` (directories and regular files; a repository holds
/// nothing else).
pub fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let dest = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &dest);
        } else {
            fs::copy(entry.path(), &dest).unwrap();
        }
    }
}
