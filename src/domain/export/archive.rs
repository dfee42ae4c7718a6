//! The streaming ZIP container of the Parquet, CSV and raw-json exports (docs/api.md §13.1).

use std::io::{self, Write};

use chrono::{DateTime, Datelike, Timelike, Utc};
use zip::write::{SimpleFileOptions, StreamWriter};
use zip::{CompressionMethod, ZipWriter};

use super::ExportError;

/// A ZIP written front to back into a non-seekable `W`: each entry's sizes and
/// CRC follow its data in a data descriptor, and the central directory comes
/// last. Data written to the `ExportZip` goes into the entry started last.
pub struct ExportZip<W: Write> {
    zip: ZipWriter<StreamWriter<W>>,
    modified: Option<zip::DateTime>,
}

impl<W: Write> ExportZip<W> {
    /// Starts an archive. Nothing is written until the first entry starts, and an
    /// archive finished without entries is a valid empty ZIP.
    pub fn new(w: W) -> Self {
        // auto_large_file switches any entry that outgrows 4 GiB to a ZIP64 data
        // descriptor instead of failing; Parquet and CSV entries ask for ZIP64
        // up front anyway because they are the ones that can get that big.
        Self { zip: ZipWriter::new_stream(w).set_auto_large_file(), modified: None }
    }

    /// Stamps entries with this time (the export's snapshot time, say). Without
    /// it entries carry the ZIP epoch, 1980-01-01, as the clock is not read here.
    /// Times outside the DOS range (1980-2107) are ignored.
    pub fn with_modified_time(mut self, time: DateTime<Utc>) -> Self {
        self.modified = u16::try_from(time.year()).ok().and_then(|year| {
            zip::DateTime::from_date_and_time(
                year,
                time.month() as u8,
                time.day() as u8,
                time.hour() as u8,
                time.minute() as u8,
                time.second() as u8,
            )
            .ok()
        });
        self
    }

    fn options(&self, method: CompressionMethod, large: bool) -> SimpleFileOptions {
        let options =
            SimpleFileOptions::default().compression_method(method).large_file(large).unix_permissions(0o644);
        match self.modified {
            Some(t) => options.last_modified_time(t),
            None => options,
        }
    }

    /// A Parquet entry: stored, since Parquet pages are already compressed, and
    /// ZIP64-capable.
    pub fn start_parquet_entry(&mut self, name: &str) -> Result<(), ExportError> {
        let options = self.options(CompressionMethod::Stored, true);
        self.zip.start_file(name, options)?;
        Ok(())
    }

    /// A CSV entry: deflated and ZIP64-capable.
    pub fn start_csv_entry(&mut self, name: &str) -> Result<(), ExportError> {
        let options = self.options(CompressionMethod::Deflated, true);
        self.zip.start_file(name, options)?;
        Ok(())
    }

    /// A raw-json entry: deflated; these are single records, so the 20 bytes a
    /// ZIP64 header costs per entry are not spent up front.
    pub fn start_json_entry(&mut self, name: &str) -> Result<(), ExportError> {
        let options = self.options(CompressionMethod::Deflated, false);
        self.zip.start_file(name, options)?;
        Ok(())
    }

    /// Ends the last entry, writes the central directory and gives `W` back.
    pub fn finish(self) -> Result<W, ExportError> {
        let stream = self.zip.finish()?;
        Ok(stream.into_inner())
    }
}

impl<W: Write> Write for ExportZip<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.zip.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.zip.flush()
    }
}
