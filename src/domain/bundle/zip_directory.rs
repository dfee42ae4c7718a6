//! Minimal reads of the ZIP central directory that the `zip` crate does not
//! expose: the declared entry count (checked before the crate loads every
//! header into memory) and the raw names including duplicates (the crate keeps
//! only one entry per name).

use std::collections::BTreeMap;
use std::io::{self, Read, Seek, SeekFrom};

const EOCD_SIGNATURE: u32 = 0x0605_4b50;
const EOCD_LEN: u64 = 22;
const ZIP64_LOCATOR_SIGNATURE: u32 = 0x0706_4b50;
const ZIP64_LOCATOR_LEN: u64 = 20;
const ZIP64_EOCD_SIGNATURE: u32 = 0x0606_4b50;
const CENTRAL_HEADER_SIGNATURE: u32 = 0x0201_4b50;
const CENTRAL_HEADER_LEN: usize = 46;
const MAX_COMMENT_LEN: u64 = 0xFFFF;

/// The entry count declared by the end-of-central-directory record (or its
/// ZIP64 twin), or `None` when no record is found; the caller then lets the
/// `zip` crate report the archive as corrupt.
pub(super) fn declared_entry_count<R: Read + Seek>(reader: &mut R) -> io::Result<Option<u64>> {
    let file_len = reader.seek(SeekFrom::End(0))?;
    if file_len < EOCD_LEN {
        return Ok(None);
    }
    let tail_len = file_len.min(EOCD_LEN + MAX_COMMENT_LEN);
    let tail_start = file_len - tail_len;
    reader.seek(SeekFrom::Start(tail_start))?;
    let mut tail = Vec::new();
    reader.by_ref().take(tail_len).read_to_end(&mut tail)?;

    let eocd_len = EOCD_LEN as usize;
    let Some(eocd_offset) =
        (0..=tail.len() - eocd_len).rev().find(|&offset| read_u32(&tail, offset) == Some(EOCD_SIGNATURE))
    else {
        return Ok(None);
    };
    let Some(count16) = read_u16(&tail, eocd_offset + 10) else {
        return Ok(None);
    };
    if count16 != 0xFFFF {
        return Ok(Some(u64::from(count16)));
    }

    // ZIP64: the locator sits right before the classic record and points at the ZIP64 record.
    let eocd_position = tail_start + eocd_offset as u64;
    let Some(locator_position) = eocd_position.checked_sub(ZIP64_LOCATOR_LEN) else {
        return Ok(Some(u64::from(count16)));
    };
    reader.seek(SeekFrom::Start(locator_position))?;
    let mut locator = [0u8; ZIP64_LOCATOR_LEN as usize];
    reader.read_exact(&mut locator)?;
    if read_u32(&locator, 0) != Some(ZIP64_LOCATOR_SIGNATURE) {
        return Ok(Some(u64::from(count16)));
    }
    let Some(record_position) = read_u64(&locator, 8) else {
        return Ok(None);
    };
    if record_position >= file_len {
        return Ok(None);
    }
    reader.seek(SeekFrom::Start(record_position))?;
    let mut record = [0u8; 56];
    if reader.read_exact(&mut record).is_err() || read_u32(&record, 0) != Some(ZIP64_EOCD_SIGNATURE) {
        return Ok(None);
    }
    Ok(read_u64(&record, 32))
}

/// Raw names that occur more than once in the central directory starting at
/// `directory_start`, with their counts. Reads at most `max_entries` headers.
pub(super) fn duplicate_raw_names<R: Read + Seek>(
    reader: &mut R,
    directory_start: u64,
    max_entries: usize,
) -> io::Result<BTreeMap<Vec<u8>, usize>> {
    reader.seek(SeekFrom::Start(directory_start))?;
    let mut counts: BTreeMap<Vec<u8>, usize> = BTreeMap::new();
    let mut header = [0u8; CENTRAL_HEADER_LEN];
    for _ in 0..max_entries {
        if reader.read_exact(&mut header).is_err() || read_u32(&header, 0) != Some(CENTRAL_HEADER_SIGNATURE) {
            break;
        }
        let field = |offset| read_u16(&header, offset).map_or(0, usize::from);
        let (name_len, extra_len, comment_len) = (field(28), field(30), field(32));
        let mut name = vec![0u8; name_len];
        reader.read_exact(&mut name)?;
        reader.seek(SeekFrom::Current((extra_len + comment_len) as i64))?;
        *counts.entry(name).or_default() += 1;
    }
    counts.retain(|_, count| *count > 1);
    Ok(counts)
}

fn read_u16(bytes: &[u8], offset: usize) -> Option<u16> {
    let slice = bytes.get(offset..offset + 2)?;
    Some(u16::from_le_bytes([slice[0], slice[1]]))
}

fn read_u32(bytes: &[u8], offset: usize) -> Option<u32> {
    let slice = bytes.get(offset..offset + 4)?;
    Some(u32::from_le_bytes([slice[0], slice[1], slice[2], slice[3]]))
}

fn read_u64(bytes: &[u8], offset: usize) -> Option<u64> {
    let slice: [u8; 8] = bytes.get(offset..offset + 8)?.try_into().ok()?;
    Some(u64::from_le_bytes(slice))
}
