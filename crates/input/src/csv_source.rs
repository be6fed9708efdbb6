//! CSV files of numbers: [`CsvSource`] reads each file into one block of shape
//! `[records, columns]` of the chosen dtype.
//!
//! Parsing is the `csv` crate's; this module turns its records into tensors and its errors into
//! messages that name the file, the line and the column. It bounds what one record may cost (a
//! file without line breaks is refused at [`CsvOptions::max_record_bytes`], not read until memory
//! runs out) and refuses numbers that do not fit the dtype rather than reading them as infinity.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use distribute_device_spec::DEFAULT_HOST;
use distribute_tensor::{DType, Element, Tensor};

use crate::InputError;
use crate::source::{BoxIter, Source};

/// How CSV files are read.
///
/// ```
/// use distribute_tensor::DType;
/// use distribute_input::CsvOptions;
///
/// let options = CsvOptions { dtype: DType::F64, ..CsvOptions::default() };
/// assert!(options.has_header);
/// assert_eq!(options.delimiter, b',');
/// assert_eq!(options.max_record_bytes, CsvOptions::DEFAULT_MAX_RECORD_BYTES);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CsvOptions {
    /// Whether the first line names the columns (and is skipped).
    pub has_header: bool,
    /// The field separator.
    pub delimiter: u8,
    /// The element type every field is parsed as: `F32`, `F64`, `I32` or `I64`.
    pub dtype: DType,
    /// The longest record (one line, or several when a quoted field spans lines) read, in bytes;
    /// a longer one is an error naming its file and line. It bounds the memory one record can
    /// take, so a file without line breaks cannot grow a record until the allocator aborts.
    pub max_record_bytes: usize,
}

impl CsvOptions {
    /// The default [`max_record_bytes`](Self::max_record_bytes): 16 MiB, a million numbers
    /// or more per record.
    pub const DEFAULT_MAX_RECORD_BYTES: usize = 16 << 20;
}

impl Default for CsvOptions {
    /// A header line, commas, `float32`, records of at most 16 MiB.
    fn default() -> Self {
        CsvOptions {
            has_header: true,
            delimiter: b',',
            dtype: DType::F32,
            max_record_bytes: Self::DEFAULT_MAX_RECORD_BYTES,
        }
    }
}

/// A number type CSV fields are parsed as.
trait CsvNumber: Element + std::str::FromStr {
    /// Whether `value`, parsed from `field`, is what the field says: a float that overflowed to
    /// infinity is not, unless the field spells out `inf` or `nan` itself.
    fn is_faithful(self, field: &str) -> bool;
}

impl CsvNumber for f32 {
    fn is_faithful(self, field: &str) -> bool {
        self.is_finite() || names_non_finite(field)
    }
}

impl CsvNumber for f64 {
    fn is_faithful(self, field: &str) -> bool {
        self.is_finite() || names_non_finite(field)
    }
}

impl CsvNumber for i32 {
    fn is_faithful(self, _: &str) -> bool {
        // Integer parsing already refuses what does not fit.
        true
    }
}

impl CsvNumber for i64 {
    fn is_faithful(self, _: &str) -> bool {
        true
    }
}

/// Whether `field` is one of the spellings of infinity or NaN that Rust's float parsing takes.
fn names_non_finite(field: &str) -> bool {
    let unsigned = field.strip_prefix(['+', '-']).unwrap_or(field);
    ["inf", "infinity", "nan"]
        .iter()
        .any(|name| unsigned.eq_ignore_ascii_case(name))
}

/// A record longer than [`CsvOptions::max_record_bytes`], carried through the `csv` reader as
/// the source of an I/O error.
#[derive(Debug)]
struct RecordTooLong {
    line: u64,
    max: usize,
}

impl std::fmt::Display for RecordTooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a record longer than {} bytes", self.max)
    }
}

impl std::error::Error for RecordTooLong {}

/// Where [`RecordLimit`] is in the CSV syntax: only a line break outside a quoted field ends a
/// record, and a quote only opens a quoted field at the field's start (as in the `csv` crate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quoting {
    FieldStart,
    Unquoted,
    Quoted,
    /// A quote inside a quoted field: the field's end, or the first half of an escaped `""`.
    QuoteInQuoted,
}

/// Passes a file's bytes through, failing once one record (bytes since the last line break
/// outside quotes) exceeds `max` bytes. It sees the bytes before the `csv` reader buffers them,
/// so the reader never holds more than about `max` bytes of one record.
struct RecordLimit<R> {
    inner: R,
    max: usize,
    delimiter: u8,
    quoting: Quoting,
    in_record: usize,
    /// Line breaks seen, and the line the current record started on.
    newlines: u64,
    record_line: u64,
}

impl<R> RecordLimit<R> {
    fn new(inner: R, max: usize, delimiter: u8) -> Self {
        RecordLimit {
            inner,
            max,
            delimiter,
            quoting: Quoting::FieldStart,
            in_record: 0,
            newlines: 0,
            record_line: 1,
        }
    }

    /// Follows one byte; true when it ends a record.
    fn ends_record(&mut self, byte: u8) -> bool {
        use Quoting::*;
        if byte == b'\n' {
            self.newlines += 1;
        }
        let line_break = matches!(byte, b'\n' | b'\r');
        let (next, ends) = match (self.quoting, byte) {
            (Quoted, b'"') => (QuoteInQuoted, false),
            (Quoted, _) => (Quoted, false),
            (QuoteInQuoted, b'"') => (Quoted, false),
            (FieldStart, b'"') => (Quoted, false),
            (_, b) if b == self.delimiter => (FieldStart, false),
            _ if line_break => (FieldStart, true),
            _ => (Unquoted, false),
        };
        self.quoting = next;
        ends
    }
}

impl<R: Read> Read for RecordLimit<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        for &byte in &buf[..n] {
            if self.ends_record(byte) {
                self.in_record = 0;
                self.record_line = self.newlines + 1;
                continue;
            }
            self.in_record += 1;
            if self.in_record > self.max {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    RecordTooLong {
                        line: self.record_line,
                        max: self.max,
                    },
                ));
            }
        }
        Ok(n)
    }
}

/// CSV files read in order, one block per file. Every record of every file needs the same
/// number of columns; fields are trimmed of surrounding spaces and parsed as the dtype.
///
/// ```
/// use distribute_input::{CsvOptions, CsvSource, Dataset};
///
/// let path = std::env::temp_dir().join(format!("csv-doc-{}.csv", std::process::id()));
/// std::fs::write(&path, "x,y\n1,2\n3,4\n5,6\n")?;
/// let ds = Dataset::from_source(CsvSource::new([&path], CsvOptions::default())?).batch(2, false)?;
/// let first = ds.iter().next().unwrap()?;
/// assert_eq!((first.shape(), first.to_vec::<f32>()?), (&[2, 2][..], vec![1.0, 2.0, 3.0, 4.0]));
/// # std::fs::remove_file(&path).ok();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct CsvSource {
    files: Vec<PathBuf>,
    options: CsvOptions,
}

impl CsvSource {
    /// A source reading `files` in order; the list must not be empty and the dtype must be
    /// one of `F32`, `F64`, `I32`, `I64`.
    pub fn new<I, P>(files: I, options: CsvOptions) -> Result<Self, InputError>
    where
        I: IntoIterator<Item = P>,
        P: AsRef<Path>,
    {
        let files: Vec<PathBuf> = files.into_iter().map(|p| p.as_ref().to_owned()).collect();
        if files.is_empty() {
            return Err(InputError::InvalidOption(
                "a CSV source needs at least one file".into(),
            ));
        }
        if !matches!(
            options.dtype,
            DType::F32 | DType::F64 | DType::I32 | DType::I64
        ) {
            return Err(InputError::InvalidOption(format!(
                "CSV fields cannot be read as {}; use float32, float64, int32 or int64",
                options.dtype
            )));
        }
        if options.max_record_bytes == 0 {
            return Err(InputError::InvalidOption(
                "CsvOptions.max_record_bytes is 0, so no record could be read; give the longest \
                 record to accept in bytes"
                    .into(),
            ));
        }
        Ok(CsvSource { files, options })
    }
}

/// Reads one CSV file into a `[records, columns]` tensor.
fn read_file(file: &Path, options: CsvOptions) -> Result<Tensor, InputError> {
    match options.dtype {
        DType::F32 => read_typed::<f32>(file, options),
        DType::F64 => read_typed::<f64>(file, options),
        DType::I32 => read_typed::<i32>(file, options),
        _ => read_typed::<i64>(file, options),
    }
}

fn read_typed<T: CsvNumber>(file: &Path, options: CsvOptions) -> Result<Tensor, InputError> {
    let opened = std::fs::File::open(file).map_err(|source| InputError::Io {
        file: file.to_owned(),
        source,
    })?;
    let limited = RecordLimit::new(opened, options.max_record_bytes, options.delimiter);
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(options.has_header)
        .delimiter(options.delimiter)
        .trim(csv::Trim::All)
        .from_reader(limited);
    let mut values: Vec<T> = Vec::new();
    let mut columns = None;
    let mut records = 0usize;
    let mut record = csv::StringRecord::new();
    loop {
        match reader.read_record(&mut record) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => return Err(csv_error(file, e)),
        }
        let line = record.position().map_or(0, |p| p.line());
        // The reader is not flexible, so it has already refused records of another width.
        columns.get_or_insert(record.len());
        for (column, field) in record.iter().enumerate() {
            let bad = |why: &str| {
                // A field may be megabytes long; its start is enough to find it.
                let shown: String = field.chars().take(40).collect();
                let ellipsis = if shown.len() < field.len() { "…" } else { "" };
                InputError::Csv {
                    file: file.to_owned(),
                    line,
                    reason: format!(
                        "column {}: '{shown}{ellipsis}' {why} {} number",
                        column + 1,
                        options.dtype
                    ),
                }
            };
            let value = field.parse::<T>().map_err(|_| bad("is not a valid"))?;
            if !value.is_faithful(field) {
                return Err(bad("is out of the range of a"));
            }
            values.push(value);
        }
        records += 1;
    }
    Ok(Tensor::from_vec(
        DEFAULT_HOST,
        &[records, columns.unwrap_or(0)],
        values,
    )?)
}

fn csv_error(file: &Path, e: csv::Error) -> InputError {
    let line = e.position().map_or(0, |p| p.line());
    match e.into_kind() {
        csv::ErrorKind::Io(source) => {
            let too_long = source
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<RecordTooLong>())
                .map(|too_long| (too_long.line, too_long.to_string()));
            match too_long {
                Some((line, what)) => InputError::Csv {
                    file: file.to_owned(),
                    line,
                    reason: format!(
                        "{what} (CsvOptions.max_record_bytes); a line break may be missing, or \
                         raise the limit"
                    ),
                },
                None => InputError::Io {
                    file: file.to_owned(),
                    source,
                },
            }
        }
        csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => InputError::Csv {
            file: file.to_owned(),
            line,
            reason: format!(
                "{len} fields where earlier records have {expected_len}; every record needs \
                 the same number of columns"
            ),
        },
        csv::ErrorKind::Utf8 { err, .. } => InputError::Csv {
            file: file.to_owned(),
            line,
            reason: format!("not valid UTF-8 text ({err})"),
        },
        other => InputError::Csv {
            file: file.to_owned(),
            line,
            reason: format!("{other:?}"),
        },
    }
}

impl Source for CsvSource {
    type Item = Tensor;

    fn blocks(&self) -> BoxIter<Tensor> {
        let files = self.files.clone();
        let options = self.options;
        Box::new(files.into_iter().map(move |file| read_file(&file, options)))
    }

    fn describe(&self) -> String {
        format!(
            "{} CSV file(s) starting with '{}'",
            self.files.len(),
            self.files[0].display()
        )
    }

    fn files(&self) -> &[PathBuf] {
        &self.files
    }

    fn with_files(
        &self,
        files: Vec<PathBuf>,
    ) -> Result<Arc<dyn Source<Item = Tensor>>, InputError> {
        Ok(Arc::new(CsvSource::new(files, self.options)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(contents: &[u8], options: CsvOptions) -> Result<Tensor, InputError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data.csv");
        std::fs::write(&path, contents).unwrap();
        read_file(&path, options)
    }

    fn headerless(dtype: DType) -> CsvOptions {
        CsvOptions {
            has_header: false,
            dtype,
            ..CsvOptions::default()
        }
    }

    /// A file without a line break once grew one record until the allocator aborted; now the
    /// record stops at the cap with an error naming the file and the record's line.
    #[test]
    fn a_record_longer_than_the_cap_is_an_error_naming_file_and_line() {
        let options = CsvOptions {
            max_record_bytes: 64,
            ..headerless(DType::F32)
        };
        let mut contents = b"1,2\n3,4\n".to_vec();
        contents.extend(std::iter::repeat_n(b'7', 10_000));
        let err = read(&contents, options).unwrap_err();
        let InputError::Csv { file, line, reason } = &err else {
            panic!("expected a CSV error, got {err:?}")
        };
        assert!(file.ends_with("data.csv"), "{err}");
        assert_eq!(*line, 3, "{err}");
        assert!(reason.contains("longer than 64 bytes"), "{err}");
        // Records up to the cap read, also where a quoted field spans lines.
        let fits = read(b"\"1\",2\n3,4\n", options).unwrap();
        assert_eq!(fits.to_vec::<f32>().unwrap(), [1.0, 2.0, 3.0, 4.0]);
        let quoted = [b"\"1".as_slice(), &[b'\n'; 70], b"\",2\n"].concat();
        assert!(
            read(&quoted, options).is_err(),
            "a quoted line break continues the record"
        );
    }

    #[test]
    fn only_line_breaks_outside_quoted_fields_end_records() {
        let ends = |text: &[u8]| {
            let mut limit = RecordLimit::new(std::io::empty(), 1, b';');
            text.iter()
                .map(|&b| limit.ends_record(b))
                .collect::<Vec<bool>>()
        };
        // A quote inside an unquoted field is literal, so the line break ends the record.
        assert_eq!(ends(b"a\"b\n"), [false, false, false, true]);
        // In a quoted field, line breaks and escaped quotes do not; after it closes, one does.
        assert_eq!(
            ends(b"\"x\n\"\"\";\n"),
            [false, false, false, false, false, false, false, true]
        );
    }

    #[test]
    fn the_default_cap_stops_a_file_without_line_breaks() {
        let contents = vec![b'1'; CsvOptions::DEFAULT_MAX_RECORD_BYTES + 1];
        let err = read(&contents, headerless(DType::F64)).unwrap_err();
        assert!(
            err.to_string()
                .contains("line 1: a record longer than 16777216 bytes"),
            "{err}"
        );
        assert!(
            CsvSource::new(
                ["x.csv"],
                CsvOptions {
                    max_record_bytes: 0,
                    ..CsvOptions::default()
                }
            )
            .is_err()
        );
    }

    /// Out-of-range floats once read as `inf`; only a field that says inf or nan may be one.
    #[test]
    fn floats_out_of_range_are_refused_unless_the_field_names_infinity() {
        let digits = format!("1{}", "0".repeat(400));
        for (field, dtype) in [
            ("1e400", DType::F64),
            ("-1e400", DType::F64),
            ("1e39", DType::F32),
            (digits.as_str(), DType::F64),
            (digits.as_str(), DType::F32),
        ] {
            let err = read(format!("0,{field}\n").as_bytes(), headerless(dtype)).unwrap_err();
            assert!(
                err.to_string().contains("line 1: column 2:")
                    && err.to_string().contains("is out of the range of a"),
                "{field}: {err}"
            );
        }
        let named = read(b"inf,-Infinity,NaN,+inf\n", headerless(DType::F64)).unwrap();
        let values = named.to_vec::<f64>().unwrap();
        assert_eq!(values[..2], [f64::INFINITY, f64::NEG_INFINITY]);
        assert!(values[2].is_nan());
        assert_eq!(values[3], f64::INFINITY);
        // Within range, and integers, read as before.
        let fine = read(b"1e38,3.5e-3\n", headerless(DType::F32)).unwrap();
        assert_eq!(fine.to_vec::<f32>().unwrap(), [1e38, 3.5e-3]);
        assert!(read(b"99999999999\n", headerless(DType::I32)).is_err());
    }
}
