//! SPDX licence expressions, as `Cargo.toml`'s `license` field holds them (`MIT OR Apache-2.0`),
//! and whether a list of allowed licences satisfies one.
//!
//! The grammar is SPDX's: licence ids joined by `OR` (weakest), `AND`, and `WITH <exception>`
//! (strongest, after a single licence), with parentheses; plus the legacy `/` that older crates
//! use for `OR`. Operators are matched in any case, as crates.io's lax parser does.

use std::fmt;

/// One word of an expression.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token<'a> {
    Open,
    Close,
    And,
    Or,
    With,
    Id(&'a str),
}

impl fmt::Display for Token<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Token::Open => "(",
            Token::Close => ")",
            Token::And => "AND",
            Token::Or => "OR",
            Token::With => "WITH",
            Token::Id(id) => id,
        };
        write!(f, "`{text}`")
    }
}

fn tokens(expression: &str) -> Vec<Token<'_>> {
    let mut tokens = Vec::new();
    for word in expression.split_whitespace() {
        let mut rest = word;
        while !rest.is_empty() {
            let end = rest.find(['(', ')', '/']).unwrap_or(rest.len());
            let (id, tail) = rest.split_at(end);
            if !id.is_empty() {
                tokens.push(match id {
                    _ if id.eq_ignore_ascii_case("AND") => Token::And,
                    _ if id.eq_ignore_ascii_case("OR") => Token::Or,
                    _ if id.eq_ignore_ascii_case("WITH") => Token::With,
                    _ => Token::Id(id),
                });
            }
            let mut chars = tail.chars();
            match chars.next() {
                Some('(') => tokens.push(Token::Open),
                Some(')') => tokens.push(Token::Close),
                Some('/') => tokens.push(Token::Or),
                _ => {}
            }
            rest = chars.as_str();
        }
    }
    tokens
}

/// Whether `expression` can be satisfied using only licences in `allowed` (ids compare in any
/// case): an `OR` needs one side, an `AND` both. `L WITH exception` is satisfied when `L` is:
/// an SPDX exception only grants permissions beyond `L`'s, never takes any away. A trailing `+`
/// ("this version or later") is satisfied by the version it names. An expression that does not
/// parse is an error that says why.
pub(super) fn satisfiable(expression: &str, allowed: &[&str]) -> Result<bool, String> {
    let tokens = tokens(expression);
    let mut parser = Parser {
        tokens: &tokens,
        at: 0,
        allowed,
    };
    let satisfied = parser.or()?;
    match parser.next() {
        None => Ok(satisfied),
        Some(token) => Err(format!("unexpected {token} after a complete expression")),
    }
}

/// A recursive-descent parser that evaluates as it goes; every branch is parsed, so a syntax
/// error is found even where the answer is already known.
struct Parser<'t, 'a> {
    tokens: &'t [Token<'t>],
    at: usize,
    allowed: &'a [&'a str],
}

impl<'t> Parser<'t, '_> {
    fn peek(&self) -> Option<Token<'t>> {
        self.tokens.get(self.at).copied()
    }

    fn next(&mut self) -> Option<Token<'t>> {
        let token = self.tokens.get(self.at).copied();
        self.at += 1;
        token
    }

    /// `and (OR and)*`
    fn or(&mut self) -> Result<bool, String> {
        let mut satisfied = self.and()?;
        while self.peek() == Some(Token::Or) {
            self.at += 1;
            satisfied |= self.and()?;
        }
        Ok(satisfied)
    }

    /// `term (AND term)*`
    fn and(&mut self) -> Result<bool, String> {
        let mut satisfied = self.term()?;
        while self.peek() == Some(Token::And) {
            self.at += 1;
            satisfied &= self.term()?;
        }
        Ok(satisfied)
    }

    /// `( or )` or `id [WITH id]`
    fn term(&mut self) -> Result<bool, String> {
        let allowed = self.allowed;
        match self.next() {
            Some(Token::Open) => {
                let satisfied = self.or()?;
                match self.next() {
                    Some(Token::Close) => Ok(satisfied),
                    Some(token) => Err(format!("expected `)`, found {token}")),
                    None => Err("a `(` is never closed".to_owned()),
                }
            }
            Some(Token::Id(id)) => {
                let licence = checked_id(id)?.trim_end_matches('+');
                if self.peek() == Some(Token::With) {
                    self.at += 1;
                    match self.next() {
                        Some(Token::Id(exception)) => {
                            checked_id(exception)?;
                        }
                        Some(token) => {
                            return Err(format!("`WITH` needs an exception, found {token}"));
                        }
                        None => return Err("`WITH` needs an exception after it".to_owned()),
                    }
                }
                Ok(allowed.iter().any(|a| a.eq_ignore_ascii_case(licence)))
            }
            Some(token) => Err(format!("expected a licence, found {token}")),
            None => Err("expected a licence, found the end".to_owned()),
        }
    }
}

/// `id` when it is spelled as an SPDX id may be: letters, digits, `.` and `-`, and an optional
/// trailing `+`.
fn checked_id(id: &str) -> Result<&str, String> {
    let body = id.strip_suffix('+').unwrap_or(id);
    if !body.is_empty()
        && body
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
    {
        Ok(id)
    } else {
        Err(format!("`{id}` is not a licence id"))
    }
}

#[test]
fn expressions_are_satisfied_only_by_the_allowed_licences() {
    let allowed = ["MIT", "Apache-2.0", "Zlib"];
    // (expression, Ok(satisfiable) or Err(part of the message))
    let cases: &[(&str, Result<bool, &str>)] = &[
        ("MIT", Ok(true)),
        ("mit", Ok(true)),
        ("GPL-3.0", Ok(false)),
        ("LicenseRef-Proprietary", Ok(false)),
        ("MIT OR GPL-3.0", Ok(true)),
        ("GPL-3.0 OR MIT", Ok(true)),
        ("MIT or Apache-2.0", Ok(true)),
        ("MIT AND Apache-2.0", Ok(true)),
        ("MIT AND GPL-3.0", Ok(false)),
        // AND binds tighter than OR.
        ("GPL-3.0 OR MIT AND Zlib", Ok(true)),
        ("MIT AND GPL-3.0 OR GPL-2.0", Ok(false)),
        ("(MIT OR Apache-2.0) AND Zlib", Ok(true)),
        ("(MIT OR Apache-2.0) AND GPL-3.0", Ok(false)),
        ("((MIT))", Ok(true)),
        ("(MIT OR Apache-2.0) AND Unicode-3.0", Ok(false)),
        // The legacy `/` is OR, with or without spaces.
        ("MIT/Apache-2.0", Ok(true)),
        ("Apache-2.0 / MIT", Ok(true)),
        ("GPL-3.0/LGPL-2.1", Ok(false)),
        // An exception only adds permissions: the licence before it decides.
        ("Apache-2.0 WITH LLVM-exception", Ok(true)),
        (
            "Apache-2.0 WITH LLVM-exception OR Apache-2.0 OR MIT",
            Ok(true),
        ),
        ("GPL-2.0 WITH Classpath-exception-2.0", Ok(false)),
        ("GPL-2.0 WITH Classpath-exception-2.0 OR MIT", Ok(true)),
        // "Or later" is satisfied by the version named.
        ("Apache-2.0+", Ok(true)),
        ("GPL-2.0+", Ok(false)),
        ("", Err("expected a licence, found the end")),
        ("MIT OR", Err("expected a licence, found the end")),
        ("AND MIT", Err("expected a licence, found `AND`")),
        ("(MIT", Err("a `(` is never closed")),
        ("(MIT Apache-2.0)", Err("expected `)`, found `Apache-2.0`")),
        ("MIT)", Err("unexpected `)`")),
        ("MIT Apache-2.0", Err("unexpected `Apache-2.0`")),
        ("MIT WITH", Err("`WITH` needs an exception after it")),
        ("MIT WITH (X)", Err("`WITH` needs an exception, found `(`")),
        ("(MIT) WITH LLVM-exception", Err("unexpected `WITH`")),
        ("MIT, Apache-2.0", Err("`MIT,` is not a licence id")),
        // Even where MIT already decides, the rest must parse.
        (
            "MIT OR GPL-3.0 AND",
            Err("expected a licence, found the end"),
        ),
    ];
    for (expression, expected) in cases {
        let got = satisfiable(expression, &allowed);
        match (expected, &got) {
            (Ok(expected), Ok(got)) => assert_eq!(got, expected, "`{expression}`"),
            (Err(part), Err(message)) => {
                assert!(message.contains(part), "`{expression}`: {message}");
            }
            _ => panic!("`{expression}`: expected {expected:?}, got {got:?}"),
        }
    }
}
