//! Step 1, ZIP safety half: readable archive, safe names, no symlinks, no
//! duplicates, no encryption, and sizes proven by actually inflating every
//! entry under a cap (never trusting the declared sizes alone).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use zip::ZipArchive;

use super::paths::{decode_entry_name, unsafe_name_reason};
use super::zip_directory::{declared_entry_count, duplicate_raw_names};
use super::{codes, Limits, Problem};

const S_IFMT: u32 = 0o170_000;
const S_IFLNK: u32 = 0o120_000;
const INFLATE_BUFFER_BYTES: usize = 64 * 1024;

/// An entry whose name is safe to use as a relative path.
#[derive(Debug, Clone)]
pub(super) struct SafeEntry {
    pub index: usize,
    /// Without the trailing `/` of directory entries.
    pub path: String,
    pub is_dir: bool,
    pub size: u64,
}

pub(super) struct ScannedArchive {
    pub archive: ZipArchive<File>,
    pub entries: Vec<SafeEntry>,
}

/// Scans the archive. `Err` carries the problems when the archive cannot be
/// scanned at all (unreadable, too many entries); otherwise the safe entries
/// and the problems found while scanning are returned together.
pub(super) fn scan_archive(
    zip_path: &Path,
    limits: &Limits,
) -> Result<(ScannedArchive, Vec<Problem>), Vec<Problem>> {
    let mut archive = open_archive(zip_path, limits)?;
    let raw_duplicates = raw_duplicate_names(zip_path, &archive, limits)?;
    let mut scan = Scan::new(&archive, &raw_duplicates, limits);
    for index in 0..archive.len() {
        scan.entry(&mut archive, index);
    }
    let Scan { mut problems, entries, .. } = scan;
    problems.extend(files_used_as_folders(&entries));
    Ok((ScannedArchive { archive, entries }, problems))
}

fn corrupt(error: &dyn std::fmt::Display) -> Vec<Problem> {
    vec![Problem::new("", codes::ZIP_CORRUPT, format!("the file is not a readable ZIP archive: {error}"))]
}

/// Opens the archive, refusing one with more entries than allowed.
fn open_archive(zip_path: &Path, limits: &Limits) -> Result<ZipArchive<File>, Vec<Problem>> {
    let mut file = File::open(zip_path).map_err(|error| corrupt(&error))?;
    // Refuse huge central directories before the zip crate materialises them.
    if let Some(count) = declared_entry_count(&mut file).map_err(|error| corrupt(&error))? {
        if count > limits.max_entries as u64 {
            return Err(vec![too_many_entries(count, limits)]);
        }
    }
    let archive = ZipArchive::new(file).map_err(|error| corrupt(&error))?;
    if archive.len() > limits.max_entries {
        return Err(vec![too_many_entries(archive.len() as u64, limits)]);
    }
    Ok(archive)
}

/// Raw names the central directory holds more than once. The zip crate keeps only one entry
/// per name, so the directory is read again to find them.
fn raw_duplicate_names(
    zip_path: &Path,
    archive: &ZipArchive<File>,
    limits: &Limits,
) -> Result<BTreeMap<Vec<u8>, usize>, Vec<Problem>> {
    if !archive.has_duplicate_names() {
        return Ok(BTreeMap::new());
    }
    let directory_start = archive.central_directory_start();
    let mut reader = File::open(zip_path).map_err(|error| corrupt(&error))?;
    duplicate_raw_names(&mut reader, directory_start, limits.max_entries + 1).map_err(|error| corrupt(&error))
}

/// What the scan carries from one entry to the next.
struct Scan<'a> {
    limits: &'a Limits,
    raw_duplicates: &'a BTreeMap<Vec<u8>, usize>,
    problems: Vec<Problem>,
    entries: Vec<SafeEntry>,
    /// Decoded name (without directory slash) to whether it was reported already.
    seen_paths: HashMap<String, bool>,
    /// Off once the declared or the inflated sizes exceed the total budget.
    inflation_allowed: bool,
    inflated_total: u64,
}

impl<'a> Scan<'a> {
    fn new(
        archive: &ZipArchive<File>,
        raw_duplicates: &'a BTreeMap<Vec<u8>, usize>,
        limits: &'a Limits,
    ) -> Self {
        let mut problems: Vec<Problem> = raw_duplicates
            .keys()
            .map(|raw_name| duplicate_problem(&String::from_utf8_lossy(raw_name)))
            .collect();
        let inflation_allowed = declared_total(archive) <= limits.max_total_uncompressed_bytes;
        if !inflation_allowed {
            problems.push(total_too_large(limits));
        }
        Scan {
            limits,
            raw_duplicates,
            problems,
            entries: Vec::with_capacity(archive.len()),
            seen_paths: HashMap::new(),
            inflation_allowed,
            inflated_total: 0,
        }
    }

    /// Checks one entry; a safely named entry that passes every check joins `entries`.
    fn entry(&mut self, archive: &mut ZipArchive<File>, index: usize) {
        let metadata = match archive.by_index_data(index) {
            Ok(entry) => EntryMetadata::from_entry(&entry),
            Err(error) => {
                self.problems.push(Problem::new("", codes::ZIP_CORRUPT, error.to_string()));
                return;
            }
        };
        let display_name =
            metadata.name.clone().unwrap_or_else(|| String::from_utf8_lossy(&metadata.raw_name).into_owned());
        let name_problem = name_problem(&metadata, &display_name);
        let name_is_safe = name_problem.is_none();
        self.problems.extend(name_problem);

        let is_dir = display_name.ends_with('/');
        let path = display_name.strip_suffix('/').unwrap_or(&display_name).to_owned();
        if name_is_safe && !self.raw_duplicates.contains_key(&metadata.raw_name) {
            self.note_path(&path);
        }
        if let Some(problem) = attribute_problem(&metadata, &display_name, self.limits) {
            self.problems.push(problem);
            return;
        }
        if self.inflation_allowed && !self.inflates_within_limits(archive, index, &metadata, &display_name) {
            return;
        }
        if name_is_safe {
            self.entries.push(SafeEntry { index, path, is_dir, size: metadata.size });
        }
    }

    /// Names that differ in bytes but decode alike, or `a` next to `a/`, would land on the
    /// same file when extracted: reported once per path.
    fn note_path(&mut self, path: &str) {
        match self.seen_paths.get_mut(path) {
            Some(reported) => {
                if !*reported {
                    self.problems.push(duplicate_problem(path));
                    *reported = true;
                }
            }
            None => {
                self.seen_paths.insert(path.to_owned(), false);
            }
        }
    }

    /// Inflates the entry to prove its size; `false` (with the problem recorded) when it is a
    /// bomb, breaks the total budget or cannot be read.
    fn inflates_within_limits(
        &mut self,
        archive: &mut ZipArchive<File>,
        index: usize,
        metadata: &EntryMetadata,
        display_name: &str,
    ) -> bool {
        let budget = self.limits.max_total_uncompressed_bytes.saturating_sub(self.inflated_total);
        let problem = match inflate_and_count(archive, index, metadata.size, budget) {
            Ok(Inflated::Exact(bytes)) => {
                self.inflated_total = self.inflated_total.saturating_add(bytes);
                if !exceeds_ratio(bytes, metadata.compressed_size, self.limits) {
                    return true;
                }
                ratio_problem(display_name, self.limits)
            }
            Ok(Inflated::LargerThanDeclared) => Problem::new(
                display_name,
                codes::ZIP_BOMB,
                "the entry inflates to more bytes than its declared size",
            ),
            Ok(Inflated::OverTotalBudget) => {
                self.inflation_allowed = false;
                total_too_large(self.limits)
            }
            Err(error) => {
                Problem::new(display_name, codes::ZIP_CORRUPT, format!("the entry cannot be read: {error}"))
            }
        };
        self.problems.push(problem);
        false
    }
}

/// The sum of the sizes the central directory declares.
fn declared_total(archive: &ZipArchive<File>) -> u64 {
    (0..archive.len())
        .filter_map(|index| archive.by_index_data(index).ok())
        .map(|entry| entry.size())
        .fold(0u64, u64::saturating_add)
}

/// Why an entry's name cannot be used as a relative path, if it cannot.
fn name_problem(metadata: &EntryMetadata, display_name: &str) -> Option<Problem> {
    match &metadata.name {
        None => Some(Problem::new(
            display_name,
            codes::ZIP_UNSAFE_PATH,
            "the entry name is flagged UTF-8 but is not valid UTF-8",
        )),
        Some(name) => {
            unsafe_name_reason(name).map(|reason| Problem::new(display_name, codes::ZIP_UNSAFE_PATH, reason))
        }
    }
}

/// What the central directory alone rules out: encryption, symlinks, oversized entries and
/// declared compression ratios beyond the limit.
fn attribute_problem(metadata: &EntryMetadata, display_name: &str, limits: &Limits) -> Option<Problem> {
    if metadata.encrypted {
        return Some(Problem::new(display_name, codes::ZIP_CORRUPT, "encrypted entries are not supported"));
    }
    if (metadata.external_attributes >> 16) & S_IFMT == S_IFLNK {
        return Some(Problem::new(display_name, codes::ZIP_SYMLINK, "symbolic links are not allowed"));
    }
    if metadata.size > limits.max_entry_bytes {
        return Some(Problem::new(
            display_name,
            codes::FILE_TOO_LARGE,
            format!("the entry is {} bytes; the limit is {} bytes", metadata.size, limits.max_entry_bytes),
        ));
    }
    exceeds_ratio(metadata.size, metadata.compressed_size, limits)
        .then(|| ratio_problem(display_name, limits))
}

/// A file `a` next to an entry `a/b` cannot both be extracted.
fn files_used_as_folders(entries: &[SafeEntry]) -> Vec<Problem> {
    let file_paths: HashSet<&str> =
        entries.iter().filter(|entry| !entry.is_dir).map(|entry| entry.path.as_str()).collect();
    let mut clashing: BTreeSet<&str> = BTreeSet::new();
    for entry in entries {
        let mut folder = entry.path.as_str();
        while let Some((parent, _)) = folder.rsplit_once('/') {
            if file_paths.contains(parent) {
                clashing.insert(parent);
            }
            folder = parent;
        }
    }
    clashing
        .into_iter()
        .map(|path| {
            Problem::new(path, codes::ZIP_DUPLICATE_ENTRY, "the path is used both as a file and as a folder")
        })
        .collect()
}

struct EntryMetadata {
    raw_name: Vec<u8>,
    name: Option<String>,
    encrypted: bool,
    external_attributes: u32,
    size: u64,
    compressed_size: u64,
}

impl EntryMetadata {
    fn from_entry(entry: &zip::read::ZipFileEntry<'_>) -> Self {
        let raw_name = entry.name_raw().to_vec();
        let name = decode_entry_name(&raw_name, entry.flags().as_u16());
        EntryMetadata {
            raw_name,
            name,
            encrypted: entry.encrypted() || entry.flags().is_encrypted(),
            external_attributes: entry.external_attributes(),
            size: entry.size(),
            compressed_size: entry.compressed_size(),
        }
    }
}

enum Inflated {
    Exact(u64),
    LargerThanDeclared,
    OverTotalBudget,
}

/// Inflates one entry into a small reusable buffer, stopping one byte past
/// the declared size or past the remaining total budget, whichever is first.
fn inflate_and_count(
    archive: &mut ZipArchive<File>,
    index: usize,
    declared_size: u64,
    total_budget: u64,
) -> io::Result<Inflated> {
    let entry = archive.by_index(index).map_err(io::Error::other)?;
    let cap = declared_size.saturating_add(1);
    let mut limited = entry.take(cap);
    let mut buffer = vec![0u8; INFLATE_BUFFER_BYTES];
    let mut produced: u64 = 0;
    loop {
        let read = match limited.read(&mut buffer) {
            Ok(read) => read,
            // The zip crate refuses to inflate past the declared size itself;
            // that is a bomb, not a damaged file.
            Err(error) if is_size_overrun(&error) => return Ok(Inflated::LargerThanDeclared),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        if read == 0 {
            return Ok(Inflated::Exact(produced));
        }
        produced = produced.saturating_add(read as u64);
        if produced > declared_size {
            return Ok(Inflated::LargerThanDeclared);
        }
        if produced > total_budget {
            return Ok(Inflated::OverTotalBudget);
        }
    }
}

fn is_size_overrun(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::InvalidData && error.to_string().contains("larger than its declared")
}

fn exceeds_ratio(size: u64, compressed_size: u64, limits: &Limits) -> bool {
    size > limits.ratio_check_min_bytes && size > compressed_size.saturating_mul(limits.max_compression_ratio)
}

fn ratio_problem(name: &str, limits: &Limits) -> Problem {
    Problem::new(
        name,
        codes::ZIP_BOMB,
        format!("the entry's compression ratio exceeds {}:1", limits.max_compression_ratio),
    )
}

fn too_many_entries(count: u64, limits: &Limits) -> Problem {
    Problem::new(
        "",
        codes::ZIP_BOMB,
        format!("the archive has {count} entries; the limit is {}", limits.max_entries),
    )
}

fn total_too_large(limits: &Limits) -> Problem {
    Problem::new(
        "",
        codes::ZIP_BOMB,
        format!("the archive inflates to more than {} bytes", limits.max_total_uncompressed_bytes),
    )
}

fn duplicate_problem(path: &str) -> Problem {
    Problem::new(path, codes::ZIP_DUPLICATE_ENTRY, "the archive holds this path more than once")
}
