//! The multi-worker all-reduce spec (TF's `MultiWorkerAllReduce(all_reduce_spec=…)`, COL-24)
//! and how it splits gradients between its algorithms by size (COL-25).
//!
//! A spec is written as TF's Python literal: an algorithm name (`"nccl"`), a tuple
//! `(alg[, shards[, limit]])`, or a list of tuples. Each entry reduces the gradients of at most
//! `limit` elements that earlier entries left, `-1` meaning all that remain.

use std::fmt;

use crate::{CollectiveError, Tensor};

/// Which gradients one spec entry takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecLimit {
    /// Those with at most this many elements (TF's `limit ≥ 0`).
    AtMost(usize),
    /// All that remain (TF's `limit = -1`).
    All,
}

/// One normalised entry of an all-reduce spec (TF's `AllReduceSpecTuple`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllReduceSpec {
    /// The algorithm, e.g. `nccl`, `xring`, `pscpu/pscpu`.
    pub alg: String,
    /// How many shards the algorithm splits each tensor into (≥ 1).
    pub shards: usize,
    /// Which gradients it takes.
    pub limit: SpecLimit,
}

impl fmt::Display for AllReduceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limit = match self.limit {
            SpecLimit::AtMost(n) => n as i64,
            SpecLimit::All => -1,
        };
        write!(f, "({:?}, {}, {limit})", self.alg, self.shards)
    }
}

/// A value of the spec's literal syntax.
#[derive(Debug, Clone, PartialEq)]
enum Literal {
    Str(String),
    Int(i64),
    Tuple(Vec<Literal>),
    List(Vec<Literal>),
}

impl AllReduceSpec {
    /// Parses and normalises a spec: `"nccl"` → `[(nccl, 1, -1)]`; `("pscpu/pscpu", 2)` →
    /// `[(pscpu/pscpu, 2, -1)]`; `("xring",)` → `[(xring, 1, -1)]`; a list of tuples is kept
    /// as given, each completed the same way. Quotes may be left out of a plain name.
    ///
    /// Fails on an empty or 4-element tuple, a list element that is not a tuple, an empty list,
    /// shards < 1, a limit below −1, brackets nested deeper than a list of tuples, or text that
    /// is not such a literal.
    ///
    /// ```
    /// use distribute_collectives::{AllReduceSpec, SpecLimit};
    ///
    /// let specs = AllReduceSpec::parse(r#"[("pscpu/pscpu", 2, 100), ("xring", 2, -1)]"#)?;
    /// assert_eq!(specs[0].limit, SpecLimit::AtMost(100));
    /// assert_eq!(specs[1].limit, SpecLimit::All);
    /// # Ok::<(), distribute_collectives::CollectiveError>(())
    /// ```
    pub fn parse(text: &str) -> Result<Vec<AllReduceSpec>, CollectiveError> {
        let mut parser = Parser {
            text,
            pos: 0,
            depth: 0,
        };
        let literal = parser.value()?;
        parser.skip_ws();
        if parser.pos != text.len() {
            return Err(parser.error("unexpected text after the spec"));
        }
        match literal {
            Literal::Str(alg) => Ok(vec![AllReduceSpec::complete(vec![Literal::Str(alg)])?]),
            Literal::Tuple(items) => Ok(vec![AllReduceSpec::complete(items)?]),
            Literal::List(items) if items.is_empty() => Err(CollectiveError::InvalidArgument(
                "an all-reduce spec list needs at least one (alg, shards, limit) tuple".into(),
            )),
            Literal::List(items) => items
                .into_iter()
                .map(|item| match item {
                    Literal::Tuple(fields) => AllReduceSpec::complete(fields),
                    other => Err(CollectiveError::InvalidArgument(format!(
                        "a tuple is expected for each all-reduce spec in a list, got {other:?}"
                    ))),
                })
                .collect(),
            Literal::Int(n) => Err(CollectiveError::InvalidArgument(format!(
                "an all-reduce spec is a name, a tuple or a list of tuples, got the number {n}"
            ))),
        }
    }

    /// Completes `(alg[, shards[, limit]])` with shards 1 and limit −1 (TF's
    /// `validate_and_complete_spec`).
    fn complete(fields: Vec<Literal>) -> Result<AllReduceSpec, CollectiveError> {
        if fields.is_empty() || fields.len() > 3 {
            return Err(CollectiveError::InvalidArgument(format!(
                "an all-reduce spec tuple has 1 to 3 elements (alg, shards, limit), got {}",
                fields.len()
            )));
        }
        let mut fields = fields.into_iter();
        let alg = match fields.next() {
            Some(Literal::Str(alg)) if !alg.is_empty() => alg,
            other => {
                return Err(CollectiveError::InvalidArgument(format!(
                    "an all-reduce spec starts with an algorithm name, got {other:?}"
                )));
            }
        };
        let shards = match fields.next() {
            None => 1,
            Some(Literal::Int(n)) if n >= 1 => n as usize,
            Some(other) => {
                return Err(CollectiveError::InvalidArgument(format!(
                    "all-reduce spec '{alg}': shards must be an integer ≥ 1, got {other:?}"
                )));
            }
        };
        let limit = match fields.next() {
            None | Some(Literal::Int(-1)) => SpecLimit::All,
            Some(Literal::Int(n)) if n >= 0 => SpecLimit::AtMost(n as usize),
            Some(other) => {
                return Err(CollectiveError::InvalidArgument(format!(
                    "all-reduce spec '{alg}': limit must be an element count ≥ 0, or -1 for \
                     all remaining tensors, got {other:?}"
                )));
            }
        };
        Ok(AllReduceSpec { alg, shards, limit })
    }
}

/// How deeply brackets may nest: a list of tuples is the deepest valid spec, and the cap keeps
/// the recursive reader from overflowing the stack on hostile input.
const MAX_NESTING: usize = 2;

/// A recursive-descent reader of the literal syntax: strings (quoted, or bare names), integers,
/// `(…)` tuples (a single element needs a trailing comma, as in Python) and `[…]` lists.
struct Parser<'a> {
    text: &'a str,
    pos: usize,
    /// How many brackets are open.
    depth: usize,
}

impl Parser<'_> {
    fn error(&self, what: &str) -> CollectiveError {
        CollectiveError::InvalidArgument(format!(
            "all-reduce spec {:?}: {what} at byte {}; expected a name like \"nccl\", a tuple \
             like (\"pscpu/pscpu\", 2, -1), or a list of such tuples",
            self.text, self.pos
        ))
    }

    fn skip_ws(&mut self) {
        let rest = &self.text[self.pos..];
        self.pos += rest.len() - rest.trim_start().len();
    }

    fn peek(&mut self) -> Option<char> {
        self.skip_ws();
        self.text[self.pos..].chars().next()
    }

    /// Enters a bracket, refusing to nest deeper than [`MAX_NESTING`].
    fn open(&mut self) -> Result<(), CollectiveError> {
        if self.depth == MAX_NESTING {
            return Err(self.error(&format!(
                "brackets nest deeper than {MAX_NESTING} levels (a list of tuples)"
            )));
        }
        self.depth += 1;
        self.pos += 1;
        Ok(())
    }

    fn value(&mut self) -> Result<Literal, CollectiveError> {
        match self.peek() {
            Some('(') => {
                self.open()?;
                let (items, trailing_comma) = self.sequence(')')?;
                // `(x)` is just `x` in Python; only `(x,)` is a one-element tuple.
                if items.len() == 1 && !trailing_comma {
                    Ok(items.into_iter().next().expect("one item"))
                } else {
                    Ok(Literal::Tuple(items))
                }
            }
            Some('[') => {
                self.open()?;
                Ok(Literal::List(self.sequence(']')?.0))
            }
            Some(quote @ ('"' | '\'')) => {
                let start = self.pos + 1;
                let len = self.text[start..]
                    .find(quote)
                    .ok_or_else(|| self.error("unterminated string"))?;
                self.pos = start + len + 1;
                Ok(Literal::Str(self.text[start..start + len].to_owned()))
            }
            Some(c) if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                let start = self.pos;
                let len = self.text[start..]
                    .find(|c: char| !(c.is_ascii_alphanumeric() || "-_/#.:".contains(c)))
                    .unwrap_or(self.text.len() - start);
                self.pos = start + len;
                let word = &self.text[start..self.pos];
                let is_int = word.strip_prefix('-').unwrap_or(word);
                if !is_int.is_empty() && is_int.bytes().all(|b| b.is_ascii_digit()) {
                    word.parse()
                        .map(Literal::Int)
                        .map_err(|_| self.error("integer out of range"))
                } else {
                    Ok(Literal::Str(word.to_owned()))
                }
            }
            _ => Err(self.error("expected a value")),
        }
    }

    /// Comma-separated values up to `close`; also says whether a comma came last.
    fn sequence(&mut self, close: char) -> Result<(Vec<Literal>, bool), CollectiveError> {
        let mut items = Vec::new();
        let mut trailing_comma = false;
        loop {
            if self.peek() == Some(close) {
                self.pos += 1;
                self.depth -= 1;
                return Ok((items, trailing_comma));
            }
            items.push(self.value()?);
            trailing_comma = false;
            match self.peek() {
                Some(',') => {
                    self.pos += 1;
                    trailing_comma = true;
                }
                Some(c) if c == close => {}
                _ => return Err(self.error(&format!("expected ',' or '{close}'"))),
            }
        }
    }
}

/// Splits each device's gradients into those of at most `threshold` elements and the rest
/// (TF's `split_grads_by_size`); a device with none of a kind is left out of that list.
///
/// The devices are split independently: for the lists to stay aligned, every device must hold
/// gradients of the same element counts in the same order ([`assign_grads_to_specs`] checks).
pub fn split_grads_by_size(
    threshold: usize,
    device_grads: &[Vec<Tensor>],
) -> (Vec<Vec<Tensor>>, Vec<Vec<Tensor>>) {
    let mut small = Vec::new();
    let mut large = Vec::new();
    for grads in device_grads {
        let (s, l): (Vec<Tensor>, Vec<Tensor>) = grads
            .iter()
            .cloned()
            .partition(|g| g.num_elements() <= threshold);
        if !s.is_empty() {
            small.push(s);
        }
        if !l.is_empty() {
            large.push(l);
        }
    }
    (small, large)
}

/// The gradients each spec entry reduces, in spec order (TF's multi-spec dispatch in
/// `MultiWorkerAllReduce`): an entry with a limit takes the remaining gradients of at most that
/// many elements, `All` takes everything left. An entry may get nothing (an empty list).
///
/// Fails with `InvalidArgument` when the devices' gradients differ in count or element counts
/// (each device would send a different gradient to the same algorithm), and with `Invariant`
/// when gradients remain after the last entry (no entry takes them).
pub fn assign_grads_to_specs(
    specs: &[AllReduceSpec],
    device_grads: &[Vec<Tensor>],
) -> Result<Vec<Vec<Vec<Tensor>>>, CollectiveError> {
    let sizes = |grads: &[Tensor]| grads.iter().map(Tensor::num_elements).collect::<Vec<_>>();
    if let Some((first, rest)) = device_grads.split_first() {
        let expected = sizes(first);
        for (d, grads) in rest.iter().enumerate() {
            let found = sizes(grads);
            if found != expected {
                return Err(CollectiveError::InvalidArgument(format!(
                    "device {}'s gradients have element counts {found:?} but device 0's have \
                     {expected:?}; every device must pass the same gradients in the same order",
                    d + 1
                )));
            }
        }
    }
    let mut remaining = device_grads.to_vec();
    let mut assigned = Vec::with_capacity(specs.len());
    for spec in specs {
        let this = match spec.limit {
            SpecLimit::All => std::mem::take(&mut remaining),
            SpecLimit::AtMost(limit) => {
                let (small, large) = split_grads_by_size(limit, &remaining);
                remaining = large;
                small
            }
        };
        assigned.push(this);
    }
    if remaining.iter().any(|g| !g.is_empty()) {
        let sizes: Vec<Vec<usize>> = remaining
            .iter()
            .map(|g| g.iter().map(Tensor::num_elements).collect())
            .collect();
        return Err(CollectiveError::Invariant(format!(
            "gradients of sizes {sizes:?} are left over after every all-reduce spec; end the \
             spec with a limit of -1 to take all that remain"
        )));
    }
    Ok(assigned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parentheses_without_a_comma_only_group_as_in_python() {
        let one = AllReduceSpec::parse("(\"nccl\")").unwrap();
        assert_eq!(one, AllReduceSpec::parse("nccl").unwrap());
        assert!(
            AllReduceSpec::parse("[(\"nccl\")]").is_err(),
            "a string, not a tuple"
        );
        assert!(
            AllReduceSpec::parse("[[\"nccl\"]]").is_err(),
            "a list, not a tuple"
        );
    }

    #[test]
    fn printed_specs_parse_back() {
        let text = " [ ( 'pscpu/pscpu' , 2 , 100 ) , (\"nccl/xring\", 1, -1), ] ";
        let specs = AllReduceSpec::parse(text).unwrap();
        let printed = format!(
            "[{}]",
            specs
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
        assert_eq!(AllReduceSpec::parse(&printed).unwrap(), specs);
    }

    #[test]
    fn nesting_deeper_than_a_list_of_tuples_is_refused_without_overflowing() {
        let deep = format!("{}nccl{}", "[".repeat(100_000), "]".repeat(100_000));
        let err = AllReduceSpec::parse(&deep).unwrap_err();
        assert!(err.to_string().contains("nest deeper than 2"), "{err}");
        assert!(AllReduceSpec::parse("[((\"nccl\", 1))]").is_err());
        assert_eq!(
            AllReduceSpec::parse("[(\"nccl\", 1)]").unwrap(),
            AllReduceSpec::parse("nccl").unwrap(),
            "two levels still parse"
        );
    }

    #[test]
    fn trailing_text_and_bad_integers_are_refused() {
        for bad in [
            "nccl nccl",
            "(\"a\", 99999999999999999999)",
            "(\"a\", 1,,)",
            "\"open",
        ] {
            assert!(AllReduceSpec::parse(bad).is_err(), "{bad}");
        }
    }
}
