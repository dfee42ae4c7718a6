//! Writes a validated bundle's files into a fresh folder.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Component, Path, PathBuf};

use zip::ZipArchive;

use super::ValidatedBundle;

/// Extracts every file of `bundle` from `zip_path` into `dest_dir`, which the
/// caller guarantees is a fresh, empty folder. Each target path is rebuilt
/// from normal components only and re-checked to stay inside `dest_dir`, so a
/// bundle from another archive cannot escape it either. Never creates symlinks
/// and never overwrites (a second write to one path fails).
pub fn extract(bundle: &ValidatedBundle, zip_path: &Path, dest_dir: &Path) -> io::Result<()> {
    let mut archive = ZipArchive::new(File::open(zip_path)?).map_err(io::Error::other)?;
    for file in &bundle.files {
        let target = contained_path(dest_dir, &file.path)?;
        let mut entry = archive.by_index(file.zip_index).map_err(io::Error::other)?;
        // The index must still name the validated entry: guards against being
        // handed a different archive than the one validated.
        if entry.name_raw() != file.path.as_bytes()
            && entry.name().ok().as_deref() != Some(file.path.as_str())
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the archive does not match the validated bundle",
            ));
        }
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent)?;
        }
        let mut output = OpenOptions::new().write(true).create_new(true).open(&target)?;
        let copied = io::copy(&mut io::Read::take(&mut entry, file.size.saturating_add(1)), &mut output)?;
        if copied != file.size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "an entry's size changed since validation",
            ));
        }
        output.sync_all()?;
    }
    Ok(())
}

/// `dest_dir` joined with the `/`-separated `relative` path, refusing any
/// component that is not a plain name.
pub(super) fn contained_path(dest_dir: &Path, relative: &str) -> io::Result<PathBuf> {
    let unsafe_path =
        || io::Error::new(io::ErrorKind::InvalidInput, format!("unsafe bundle path {relative:?}"));
    let mut target = dest_dir.to_path_buf();
    for segment in relative.split('/') {
        if segment.is_empty() || segment.contains('\\') || segment.contains('\0') {
            return Err(unsafe_path());
        }
        let mut components = Path::new(segment).components();
        match (components.next(), components.next()) {
            (Some(Component::Normal(name)), None) if name == segment => target.push(name),
            _ => return Err(unsafe_path()),
        }
    }
    if !target.starts_with(dest_dir) || target == dest_dir {
        return Err(unsafe_path());
    }
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::contained_path;
    use std::path::Path;

    #[test]
    fn paths_stay_inside() {
        let root = Path::new("/tmp/dest");
        assert_eq!(contained_path(root, "app/index.html").ok(), Some(root.join("app").join("index.html")));
        for bad in ["", "../x", "a/../../x", "/etc/passwd", "a//b", "a/./b", "a\\b"] {
            assert!(contained_path(root, bad).is_err(), "{bad}");
        }
    }
}
