//! CSV files of numbers: [`CsvSource`] reads each file into one block of shape
//! `[records, columns]` of the chosen dtype.
//!
//! Parsing is the `csv` crate's; this module turns its records into tensors and its errors into
//! messages that name the file, the line and the column.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use distribute_collectives::{DType, Element, Tensor};
use distribute_device_spec::DEFAULT_HOST;

use crate::InputError;
use crate::dataset::{BoxIter, Source};

/// How CSV files are read.
///
/// ```
/// use distribute_collectives::DType;
/// use distribute_input::CsvOptions;
///
/// let options = CsvOptions { dtype: DType::F64, ..CsvOptions::default() };
/// assert!(options.has_header);
/// assert_eq!(options.delimiter, b',');
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CsvOptions {
    /// Whether the first line names the columns (and is skipped).
    pub has_header: bool,
    /// The field separator.
    pub delimiter: u8,
    /// The element type every field is parsed as: `F32`, `F64`, `I32` or `I64`.
    pub dtype: DType,
}

impl Default for CsvOptions {
    /// A header line, commas, `float32`.
    fn default() -> Self {
        CsvOptions {
            has_header: true,
            delimiter: b',',
            dtype: DType::F32,
        }
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

fn read_typed<T: Element + std::str::FromStr>(
    file: &Path,
    options: CsvOptions,
) -> Result<Tensor, InputError> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(options.has_header)
        .delimiter(options.delimiter)
        .trim(csv::Trim::All)
        .from_path(file)
        .map_err(|e| csv_error(file, e))?;
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
            let value = field.parse::<T>().map_err(|_| InputError::Csv {
                file: file.to_owned(),
                line,
                reason: format!(
                    "column {}: '{field}' is not a valid {} number",
                    column + 1,
                    options.dtype
                ),
            })?;
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
        csv::ErrorKind::Io(source) => InputError::Io {
            file: file.to_owned(),
            source,
        },
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
