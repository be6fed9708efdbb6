//! `.npy` files: a strict reader and writer of NumPy's format versions 1 and 2 for
//! little-endian `float32`, `float64`, `int32` and `int64` arrays in C order, and
//! [`NpySource`], which reads one block per file.
//!
//! Anything else (big-endian data, Fortran order, other dtypes, pickled objects, version 3's
//! UTF-8 headers) is refused with a message saying what was found and what is supported.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use distribute_device_spec::DEFAULT_HOST;
use distribute_tensor::{DType, Tensor};

use crate::InputError;
use crate::source::{BoxIter, Source};

const MAGIC: &[u8] = b"\x93NUMPY";

/// Reads a `.npy` file into a host tensor.
///
/// ```
/// use distribute_tensor::Tensor;
/// use distribute_input::npy;
///
/// let path = std::env::temp_dir().join(format!("npy-doc-{}.npy", std::process::id()));
/// let t = Tensor::from_vec("/cpu:0", &[2, 3], vec![1.5f64, 2.0, 3.0, 4.0, 5.0, 6.0])?;
/// npy::write(&path, &t)?;
/// let back = npy::read(&path)?;
/// assert_eq!((back.shape(), back.to_vec::<f64>()?), (&[2, 3][..], t.to_vec::<f64>()?));
/// # std::fs::remove_file(&path).ok();
/// # Ok::<(), distribute_input::InputError>(())
/// ```
pub fn read(path: &Path) -> Result<Tensor, InputError> {
    let bytes = std::fs::read(path).map_err(|source| InputError::Io {
        file: path.to_owned(),
        source,
    })?;
    parse(&bytes).map_err(|reason| InputError::Npy {
        file: path.to_owned(),
        reason,
    })
}

/// Writes `tensor` as a version 1 `.npy` file (little-endian, C order). Only `float32`,
/// `float64`, `int32` and `int64` tensors can be written.
pub fn write(path: &Path, tensor: &Tensor) -> Result<(), InputError> {
    let descr = match tensor.dtype() {
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        other => {
            return Err(InputError::Npy {
                file: path.to_owned(),
                reason: format!("cannot write {other} tensors; supported: {SUPPORTED}"),
            });
        }
    };
    let shape = match tensor.shape() {
        [] => "()".to_owned(),
        [n] => format!("({n},)"),
        dims => format!(
            "({})",
            dims.iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // Magic, version and length take 10 bytes; data starts 64-byte aligned after the newline.
    let total = (10 + header.len() + 1).div_ceil(64) * 64;
    header.push_str(&" ".repeat(total - 10 - header.len() - 1));
    header.push('\n');
    let mut bytes = Vec::with_capacity(total + tensor.size_in_bytes());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&[1, 0]);
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    match tensor.dtype() {
        DType::F32 => extend(&mut bytes, tensor.to_vec::<f32>()?, f32::to_le_bytes),
        DType::F64 => extend(&mut bytes, tensor.to_vec::<f64>()?, f64::to_le_bytes),
        DType::I32 => extend(&mut bytes, tensor.to_vec::<i32>()?, i32::to_le_bytes),
        _ => extend(&mut bytes, tensor.to_vec::<i64>()?, i64::to_le_bytes),
    }
    std::fs::write(path, bytes).map_err(|source| InputError::Io {
        file: path.to_owned(),
        source,
    })
}

fn extend<T, const N: usize>(out: &mut Vec<u8>, values: Vec<T>, to: fn(T) -> [u8; N]) {
    for v in values {
        out.extend_from_slice(&to(v));
    }
}

const SUPPORTED: &str = "little-endian float32 (<f4), float64 (<f8), int32 (<i4), int64 (<i8) \
                         in C order, format version 1 or 2";

fn parse(bytes: &[u8]) -> Result<Tensor, String> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err("the file does not start with the .npy magic string \\x93NUMPY".into());
    }
    let (header_len, start): (usize, usize) = match (bytes[6], bytes[7]) {
        (1, 0) => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        (2, 0) => {
            if bytes.len() < 12 {
                return Err("truncated version 2 header".into());
            }
            let len = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
            (len as usize, 12)
        }
        (major, minor) => {
            return Err(format!(
                "format version {major}.{minor}; supported: {SUPPORTED}"
            ));
        }
    };
    let end = start
        .checked_add(header_len)
        .ok_or("the header length is larger than memory")?;
    let header = bytes.get(start..end).ok_or("truncated header")?;
    let header = std::str::from_utf8(header).map_err(|_| "the header is not ASCII")?;
    let Header {
        descr,
        fortran_order,
        shape,
    } = Header::parse(header)?;
    if fortran_order {
        return Err(
            "fortran_order is True; save a C-order array (np.ascontiguousarray)".to_owned(),
        );
    }
    let dtype = match descr.as_str() {
        "<f4" => DType::F32,
        "<f8" => DType::F64,
        "<i4" => DType::I32,
        "<i8" => DType::I64,
        other => return Err(format!("dtype '{other}'; supported: {SUPPORTED}")),
    };
    let data = &bytes[end..];
    // A malformed header can name any dimensions. Like NumPy, the size of the non-zero
    // dimensions must fit in memory even when a zero one makes the array empty.
    let bytes_needed = shape
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(dtype.size_in_bytes(), |bytes, &d| bytes.checked_mul(d))
        .filter(|&bytes| isize::try_from(bytes).is_ok())
        .ok_or_else(|| {
            format!(
                "shape {shape:?} of {dtype} needs more bytes than this machine can address; \
                 the header is corrupt"
            )
        })?;
    let expected = if shape.contains(&0) { 0 } else { bytes_needed };
    if data.len() != expected {
        return Err(format!(
            "shape {shape:?} of {dtype} needs {expected} bytes of data, the file has {}",
            data.len()
        ));
    }
    let tensor = match dtype {
        DType::F32 => decode(&shape, data, f32::from_le_bytes),
        DType::F64 => decode(&shape, data, f64::from_le_bytes),
        DType::I32 => decode(&shape, data, i32::from_le_bytes),
        _ => decode(&shape, data, i64::from_le_bytes),
    };
    tensor.map_err(|e| e.to_string())
}

fn decode<T: distribute_tensor::Element, const N: usize>(
    shape: &[usize],
    data: &[u8],
    from: fn([u8; N]) -> T,
) -> Result<Tensor, distribute_tensor::TensorError> {
    let values = data
        .chunks_exact(N)
        .map(|c| from(c.try_into().expect("chunks_exact gives N bytes")))
        .collect();
    Tensor::from_vec(DEFAULT_HOST, shape, values)
}

/// The three entries of a `.npy` header, which is the text of a Python dict literal.
#[derive(Debug, PartialEq)]
struct Header {
    descr: String,
    fortran_order: bool,
    shape: Vec<usize>,
}

/// A value of the Python literals a `.npy` header is made of.
#[derive(Debug, Clone, PartialEq)]
enum Literal {
    Str(String),
    Bool(bool),
    /// An integer as written (it may be negative or too large for a dimension).
    Int(String),
    Tuple(Vec<Literal>),
}

impl std::fmt::Display for Literal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Literal::Str(s) => write!(f, "'{s}'"),
            Literal::Bool(b) => f.write_str(if *b { "True" } else { "False" }),
            Literal::Int(i) => f.write_str(i),
            Literal::Tuple(items) => {
                let items: Vec<String> = items.iter().map(ToString::to_string).collect();
                match items.as_slice() {
                    [one] => write!(f, "({one},)"),
                    _ => write!(f, "({})", items.join(", ")),
                }
            }
        }
    }
}

impl Header {
    /// Parses the header as NumPy does (`ast.literal_eval`, then its checks): a dict with
    /// exactly the keys `descr`, `fortran_order` and `shape`, a string, a bool and a tuple of
    /// non-negative integers. Finding keys by substring instead let a crafted header name a
    /// dtype inside another entry, and took `(5)` (the integer 5) and `(2,,3)` for shapes.
    fn parse(text: &str) -> Result<Header, String> {
        let entries = LiteralParser { text, pos: 0 }.dict()?;
        let mut descr = None;
        let mut fortran_order = None;
        let mut shape = None;
        for (key, value) in entries {
            let slot = match key.as_str() {
                "descr" => &mut descr,
                "fortran_order" => &mut fortran_order,
                "shape" => &mut shape,
                other => {
                    return Err(format!(
                        "the header has an unexpected key '{other}'; a .npy header has exactly \
                         'descr', 'fortran_order' and 'shape'"
                    ));
                }
            };
            if slot.replace(value).is_some() {
                return Err(format!("the header has the key '{key}' twice"));
            }
        }
        let missing = |key: &str| format!("the header has no '{key}' entry");
        let descr = match descr.ok_or_else(|| missing("descr"))? {
            Literal::Str(descr) => descr,
            other => return Err(format!("dtype {other}; supported: {SUPPORTED}")),
        };
        let fortran_order = match fortran_order.ok_or_else(|| missing("fortran_order"))? {
            Literal::Bool(b) => b,
            other => return Err(format!("fortran_order is {other}, not True or False")),
        };
        let shape = match shape.ok_or_else(|| missing("shape"))? {
            Literal::Tuple(dims) => dims
                .iter()
                .map(|d| match d {
                    Literal::Int(i) => i.parse::<usize>().map_err(|_| {
                        format!(
                            "shape {}: '{i}' is not a dimension",
                            Literal::Tuple(dims.clone())
                        )
                    }),
                    other => Err(format!(
                        "shape {}: '{other}' is not a dimension",
                        Literal::Tuple(dims.clone())
                    )),
                })
                .collect::<Result<Vec<usize>, String>>()?,
            other => return Err(format!("shape {other} is not a tuple")),
        };
        Ok(Header {
            descr,
            fortran_order,
            shape,
        })
    }
}

/// A recursive-descent reader of the Python literals in a `.npy` header: a dict of string keys
/// whose values are strings, `True`/`False`, decimal integers and tuples of them.
struct LiteralParser<'t> {
    text: &'t str,
    pos: usize,
}

impl<'t> LiteralParser<'t> {
    fn rest(&self) -> &'t str {
        &self.text[self.pos..]
    }

    fn skip_space(&mut self) {
        let rest = self.rest();
        self.pos += rest.len() - rest.trim_start().len();
    }

    fn error(&self, expected: &str) -> String {
        match self.rest().chars().next() {
            Some(c) => format!(
                "the header is not a Python dict literal: expected {expected} at byte {}, found \
                 '{c}'",
                self.pos
            ),
            None => {
                format!(
                    "the header is not a Python dict literal: expected {expected}, found its end"
                )
            }
        }
    }

    /// Consumes `c` (after white space) if it comes next.
    fn eat(&mut self, c: char) -> bool {
        self.skip_space();
        if self.rest().starts_with(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn dict(mut self) -> Result<Vec<(String, Literal)>, String> {
        if !self.eat('{') {
            return Err(self.error("'{'"));
        }
        let mut entries = Vec::new();
        while !self.eat('}') {
            self.skip_space();
            let key = match self.value()? {
                Literal::Str(key) => key,
                other => return Err(format!("the header has a key {other} that is not a string")),
            };
            if !self.eat(':') {
                return Err(self.error("':'"));
            }
            entries.push((key, self.value()?));
            if !self.eat(',') {
                if !self.eat('}') {
                    return Err(self.error("',' or '}'"));
                }
                break;
            }
        }
        self.skip_space();
        if !self.rest().is_empty() {
            return Err(self.error("the end of the header after the dict"));
        }
        Ok(entries)
    }

    fn value(&mut self) -> Result<Literal, String> {
        self.skip_space();
        let rest = self.rest();
        let Some(first) = rest.chars().next() else {
            return Err(self.error("a value"));
        };
        match first {
            '\'' | '"' => {
                let body = &rest[1..];
                let end = body
                    .find([first, '\\'])
                    .filter(|&i| body[i..].starts_with(first))
                    .ok_or_else(|| {
                        format!(
                            "the header has a string at byte {} that is not closed (or uses an \
                             escape, which .npy headers do not need)",
                            self.pos
                        )
                    })?;
                self.pos += end + 2;
                Ok(Literal::Str(body[..end].to_owned()))
            }
            '(' => {
                self.pos += 1;
                if self.eat(')') {
                    return Ok(Literal::Tuple(Vec::new()));
                }
                let first = self.value()?;
                if self.eat(')') {
                    // Parentheses around one value without a comma group, they make no tuple.
                    return Ok(first);
                }
                let mut items = vec![first];
                loop {
                    if !self.eat(',') {
                        return Err(self.error("',' or ')'"));
                    }
                    if self.eat(')') {
                        return Ok(Literal::Tuple(items));
                    }
                    items.push(self.value()?);
                    if self.eat(')') {
                        return Ok(Literal::Tuple(items));
                    }
                }
            }
            '-' | '0'..='9' => {
                let sign = usize::from(first == '-');
                let digits = rest[sign..]
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(rest.len() - sign);
                if digits == 0 {
                    return Err(self.error("a digit after '-'"));
                }
                let number = &rest[sign..sign + digits];
                if number.len() > 1 && number.starts_with('0') && number.contains(|c| c != '0') {
                    // Python 3 has no leading-zero integers (`010` is a syntax error).
                    return Err(self.error("an integer without leading zeros"));
                }
                self.pos += sign + digits;
                Ok(Literal::Int(rest[..sign + digits].to_owned()))
            }
            _ if rest.starts_with("True") => {
                self.pos += 4;
                Ok(Literal::Bool(true))
            }
            _ if rest.starts_with("False") => {
                self.pos += 5;
                Ok(Literal::Bool(false))
            }
            _ => Err(self.error("a string, True, False, an integer or a tuple")),
        }
    }
}

/// `.npy` files read in order, one block per file: the rows are the first axis of each file's
/// array, so all files need the same dtype and trailing dimensions.
///
/// ```
/// use distribute_input::{Dataset, NpySource, Source};
///
/// let source = NpySource::new(["a.npy", "b.npy"])?;
/// assert_eq!(source.files().len(), 2);
/// let dataset = Dataset::from_source(source).batch(32, false)?;
/// assert!(dataset.iter().next().unwrap().is_err(), "the files do not exist");
/// # Ok::<(), distribute_input::InputError>(())
/// ```
#[derive(Debug, Clone)]
pub struct NpySource {
    files: Vec<PathBuf>,
}

impl NpySource {
    /// A source reading `files` in order; the list must not be empty. Files are opened when
    /// iterated, so errors about their contents come from the iterator.
    pub fn new<I, P>(files: I) -> Result<Self, InputError>
    where
        I: IntoIterator<Item = P>,
        P: AsRef<Path>,
    {
        let files: Vec<PathBuf> = files.into_iter().map(|p| p.as_ref().to_owned()).collect();
        if files.is_empty() {
            return Err(InputError::InvalidOption(
                "an .npy source needs at least one file".into(),
            ));
        }
        Ok(NpySource { files })
    }
}

impl Source for NpySource {
    type Item = Tensor;

    fn blocks(&self) -> BoxIter<Tensor> {
        let files = self.files.clone();
        Box::new(files.into_iter().map(|file| {
            let tensor = read(&file)?;
            if tensor.rank() == 0 {
                return Err(InputError::NoBatchDimension {
                    origin: format!("'{}'", file.display()),
                    path: "the top level".into(),
                });
            }
            Ok(tensor)
        }))
    }

    fn describe(&self) -> String {
        format!(
            "{} .npy file(s) starting with '{}'",
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
        Ok(Arc::new(NpySource::new(files)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(dict: &str) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&[1, 0]);
        b.extend_from_slice(&(dict.len() as u16).to_le_bytes());
        b.extend_from_slice(dict.as_bytes());
        b
    }

    #[test]
    fn refusals_say_what_was_found() {
        let cases = [
            (b"PK\x03\x04 zip".to_vec(), "magic"),
            (
                header("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }"),
                "dtype '>f4'",
            ),
            (
                header("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }"),
                "dtype '|O'",
            ),
            (
                header("{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }"),
                "fortran_order is True",
            ),
            (
                header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }"),
                "needs 8 bytes",
            ),
            (
                header("{'descr': '<f4', 'fortran_order': False, }"),
                "no 'shape'",
            ),
            (
                header("{'descr': '<f4', 'fortran_order': False, 'shape': (x,), }"),
                "expected a string, True, False, an integer or a tuple at byte 51, found 'x'",
            ),
            (
                header("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }"),
                "shape (-1,): '-1' is not a dimension",
            ),
            (
                header("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,), }"),
                "fortran_order is 0, not True or False",
            ),
        ];
        for (bytes, expected) in cases {
            let err = parse(&bytes).unwrap_err();
            assert!(err.contains(expected), "{expected:?} not in {err:?}");
        }
    }

    fn with_data(dict: &str, data: &[u8]) -> Vec<u8> {
        [header(dict), data.to_vec()].concat()
    }

    /// The header is the Python literal NumPy reads with `ast.literal_eval`: keys are found as
    /// dict keys, not as substrings anywhere, and shapes must be tuples.
    #[test]
    fn headers_parse_as_python_dict_literals() {
        let data = 1.5f64.to_le_bytes();
        // Keys were found by substring: this header's first `'descr':` lies inside another
        // entry, and its f64 data was read as i64.
        let crafted = "{'note': \"'descr': '<i8',\", 'descr': '<f8', 'fortran_order': False, \
                       'shape': (1,), }";
        let err = parse(&with_data(crafted, &data)).unwrap_err();
        assert!(err.contains("unexpected key 'note'"), "{err}");
        for (dict, expected) in [
            // `(5)` is the integer 5 in Python, not a tuple; NumPy refuses it.
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (5), }",
                "shape 5 is not a tuple",
            ),
            // A syntax error in Python.
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (2,,3), }",
                "expected a string, True, False, an integer or a tuple at byte 53, found ','",
            ),
            (
                "{'descr': '<f8', 'descr': '<i8', 'fortran_order': False, 'shape': (1,), }",
                "the key 'descr' twice",
            ),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), } junk",
                "expected the end of the header after the dict",
            ),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (010,), }",
                "an integer without leading zeros",
            ),
            (
                "{'descr': '<f\\x38', 'fortran_order': False, 'shape': (1,), }",
                "not closed (or uses an escape",
            ),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (1,)",
                "expected ',' or '}', found its end",
            ),
        ] {
            let err = parse(&with_data(dict, &data)).unwrap_err();
            assert!(
                err.contains(expected),
                "{dict}: {expected:?} not in {err:?}"
            );
        }
        // What NumPy writes and accepts: either quote, any spacing, trailing commas or none,
        // padding and the final newline.
        for (dict, shape) in [
            (
                "{\"descr\": \"<f8\", \"fortran_order\": False, \"shape\": (1,)}   \n",
                vec![1],
            ),
            (
                "{'shape':(1,1,),'fortran_order':False,'descr':'<f8'}",
                vec![1, 1],
            ),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': ((1, 1)), }",
                vec![1, 1],
            ),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (), }",
                vec![],
            ),
        ] {
            let t = parse(&with_data(dict, &data)).unwrap();
            assert_eq!(
                (t.shape(), t.to_vec::<f64>().unwrap()),
                (&shape[..], vec![1.5]),
                "{dict}"
            );
        }
    }

    #[test]
    fn oversized_shapes_are_refused_without_overflow() {
        let dir = tempfile::tempdir().unwrap();
        let shapes = [
            // The element count overflows.
            "(4294967296, 4294967296, 16)",
            // The count fits but its bytes do not.
            "(4611686018427387904,)",
        ];
        for shape in shapes {
            let path = dir.path().join("evil.npy");
            let dict = format!("{{'descr': '<f8', 'fortran_order': False, 'shape': {shape}, }}");
            std::fs::write(&path, header(&dict)).unwrap();
            let err = read(&path).unwrap_err();
            assert!(matches!(err, InputError::Npy { .. }), "{err}");
            let message = err.to_string();
            assert!(
                message.contains("evil.npy") && message.contains("more bytes than this machine"),
                "{message}"
            );
        }
        // NumPy refuses these even when a zero dimension makes the array empty.
        let empty = header(
            "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296, 0), }",
        );
        assert!(parse(&empty).unwrap_err().contains("more bytes"));
        let empty = header("{'descr': '<f8', 'fortran_order': False, 'shape': (3, 0), }");
        assert_eq!(parse(&empty).unwrap().shape(), [3, 0]);
    }

    #[test]
    fn version_2_headers_and_scalars_parse() {
        let dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (), }";
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&[2, 0]);
        b.extend_from_slice(&(dict.len() as u32).to_le_bytes());
        b.extend_from_slice(dict.as_bytes());
        b.extend_from_slice(&7i32.to_le_bytes());
        let t = parse(&b).unwrap();
        assert_eq!((t.rank(), t.to_vec::<i32>().unwrap()), (0, vec![7]));
    }
}
