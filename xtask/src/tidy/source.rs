//! Rust source read lexically, for the tidy checks that look at code ([`super::cycles`],
//! [`super::single_copies`], [`super::poison`]): [`tokens`] drops comments and keeps literals
//! whole, [`Parsed`] finds what a file declares (`mod`, `use`, items, exported macros) and the
//! paths its code names, outside the items under `#[cfg(test)]`. No parser of Rust's grammar:
//! what the checks need is names and paths, which the tokens give.

use std::collections::BTreeSet;

/// One token of Rust source; comments and whitespace are dropped, a char literal becomes
/// `Punct('\'')`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Token {
    /// An identifier or keyword; `$crate` in a macro body is one.
    Ident(String),
    /// A string literal's contents (escapes left as they are).
    Str(String),
    /// A number literal as written (`0xcbf2_9ce4_8422_2325u64`).
    Number(String),
    /// `::`.
    PathSep,
    /// Any other character.
    Punct(char),
}

/// The tokens of `text`.
pub(super) fn tokens(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let word = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            loop {
                match (at(i), at(i + 1)) {
                    ('\0', _) => break,
                    ('/', '*') => (depth, i) = (depth + 1, i + 2),
                    ('*', '/') => (depth, i) = (depth - 1, i + 2),
                    _ => i += 1,
                }
                if depth == 0 {
                    break;
                }
            }
        } else if c == '"' {
            let start = i + 1;
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            out.push(Token::Str(
                chars[start..i.min(chars.len())].iter().collect(),
            ));
            i += 1;
        } else if c == '\'' {
            // A char literal ('x', '\n', '\''), else a lifetime's quote.
            if at(i + 1) == '\\' {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
            }
            out.push(Token::Punct('\''));
        } else if c.is_ascii_digit() {
            let start = i;
            while word(at(i)) || (at(i) == '.' && at(i + 1).is_ascii_digit()) {
                i += 1;
            }
            out.push(Token::Number(chars[start..i].iter().collect()));
        } else if word(c) || (c == '$' && word(at(i + 1))) {
            let start = i;
            i += 1;
            while word(at(i)) {
                i += 1;
            }
            let ident: String = chars[start..i].iter().collect();
            let raw = matches!(ident.as_str(), "r" | "br" | "cr");
            if raw && (at(i) == '"' || (at(i) == '#' && matches!(at(i + 1), '#' | '"'))) {
                let hashes = chars[i..].iter().take_while(|&&c| c == '#').count();
                let start = i + hashes + 1;
                let mut end = start;
                while end < chars.len()
                    && !(chars[end] == '"' && (1..=hashes).all(|k| at(end + k) == '#'))
                {
                    end += 1;
                }
                out.push(Token::Str(
                    chars[start..end.min(chars.len())].iter().collect(),
                ));
                i = end + hashes + 1;
            } else if !matches!(ident.as_str(), "b" | "c") || !matches!(at(i), '"' | '\'') {
                out.push(Token::Ident(ident));
            }
            // `b"…"`, `c"…"` and `b'…'` continue as the literal they prefix.
        } else if c == ':' && at(i + 1) == ':' {
            out.push(Token::PathSep);
            i += 2;
        } else {
            out.push(Token::Punct(c));
            i += 1;
        }
    }
    out
}

fn is(token: Option<&Token>, ident: &str) -> bool {
    matches!(token, Some(Token::Ident(s)) if s == ident)
}

fn is_punct(token: Option<&Token>, c: char) -> bool {
    token == Some(&Token::Punct(c))
}

/// The index after the bracketed group that opens at `open` (`(`, `[` or `{`), or the end.
fn after_group(tokens: &[Token], open: usize) -> usize {
    let mut depth = 0i32;
    for (i, token) in tokens.iter().enumerate().skip(open) {
        match token {
            Token::Punct('(' | '[' | '{') => depth += 1,
            Token::Punct(')' | ']' | '}') => depth -= 1,
            _ => {}
        }
        if depth == 0 {
            return i + 1;
        }
    }
    tokens.len()
}

/// Whether the attribute whose `[` is at `open` is a `cfg` that holds only under test
/// (`#[cfg(test)]`, `#[cfg(all(test, …))]`).
fn is_test_cfg(tokens: &[Token], open: usize) -> bool {
    let inner = &tokens[open + 1..after_group(tokens, open).saturating_sub(1)];
    is(inner.first(), "cfg")
        && inner.iter().any(|t| is(Some(t), "test"))
        && !inner
            .iter()
            .any(|t| is(Some(t), "not") || is(Some(t), "any"))
}

/// `tokens` without the items under a test-only `cfg` (the attribute, those after it, and the
/// item to its `;` or its closing `}`); none at all for a file that is test-only (`#![cfg(test)]`).
pub(super) fn without_tests(tokens: &[Token]) -> Vec<Token> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let inner = is_punct(tokens.get(i + 1), '!');
        let open = if inner { i + 2 } else { i + 1 };
        let test_cfg = is_punct(tokens.get(i), '#')
            && is_punct(tokens.get(open), '[')
            && is_test_cfg(tokens, open);
        if !test_cfg {
            out.push(tokens[i].clone());
            i += 1;
            continue;
        }
        if inner {
            return Vec::new();
        }
        i = after_group(tokens, open);
        while is_punct(tokens.get(i), '#') && is_punct(tokens.get(i + 1), '[') {
            i = after_group(tokens, i + 1);
        }
        while i < tokens.len() {
            match tokens[i] {
                Token::Punct(';') => {
                    i += 1;
                    break;
                }
                Token::Punct('{') => {
                    i = after_group(tokens, i);
                    break;
                }
                Token::Punct('(' | '[') => i = after_group(tokens, i),
                _ => i += 1,
            }
        }
    }
    out
}

/// One name a `use` declaration brings in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Use {
    /// `pub`, `pub(crate)`, … : a re-export.
    pub(super) public: bool,
    /// The path, `self` of a group resolved (`use a::{self}` is `a`).
    pub(super) path: Vec<String>,
    /// The name it binds (the last segment, or the `as` name); `None` for a glob (`*`).
    pub(super) name: Option<String>,
}

/// A module that a file declares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ModDecl {
    pub(super) name: String,
    /// Declared with a body (`mod x { … }`) rather than in a file of its own (`mod x;`).
    pub(super) inline: bool,
    /// Its `#[path = "…"]`, if any.
    pub(super) path: Option<String>,
}

/// What one file declares and names, outside its test-only items.
#[derive(Debug, Default)]
pub(super) struct Parsed {
    pub(super) mods: Vec<ModDecl>,
    pub(super) uses: Vec<Use>,
    /// Paths of two segments or more in code outside `use` declarations (`crate::a::B`,
    /// `super::x`, `batch::Batch`, `crate::m!`), leading `::` paths left out.
    pub(super) paths: Vec<Vec<String>>,
    /// Every identifier outside `use` declarations.
    pub(super) idents: BTreeSet<String>,
    /// Names of the items it defines (fn, struct, enum, trait, type, const, static, union,
    /// macro_rules).
    pub(super) defines: BTreeSet<String>,
    /// Its `#[macro_export]` macros, which live at the crate root.
    pub(super) exported_macros: Vec<String>,
}

impl Parsed {
    /// Parses the tokens of a file (test-only items are left out here).
    pub(super) fn of(tokens: &[Token]) -> Parsed {
        let tokens = without_tests(tokens);
        let t = &tokens;
        let mut parsed = Parsed::default();
        let (mut path_attr, mut export) = (None, false);
        // The inline modules around `i` (name, index after its body), outermost first.
        let mut inline: Vec<(String, usize)> = Vec::new();
        let mut i = 0;
        while i < t.len() {
            while inline.last().is_some_and(|&(_, end)| i >= end) {
                inline.pop();
            }
            let around: Vec<String> = inline.iter().map(|(name, _)| name.clone()).collect();
            let ident = match &t[i] {
                Token::Ident(ident) => ident.as_str(),
                Token::Punct('#') if is_punct(t.get(i + 1), '[') => {
                    if is(t.get(i + 2), "path")
                        && is_punct(t.get(i + 3), '=')
                        && let Some(Token::Str(path)) = t.get(i + 4)
                    {
                        path_attr = Some(path.clone());
                    }
                    export |= is(t.get(i + 2), "macro_export");
                    i = after_group(t, i + 1);
                    continue;
                }
                _ => {
                    i += 1;
                    continue;
                }
            };
            match ident {
                "use" => {
                    let public = is_public(t, i);
                    let first = parsed.uses.len();
                    i = use_tree(t, i + 1, &[], public, &mut parsed.uses);
                    for u in &mut parsed.uses[first..] {
                        u.path = from_file(std::mem::take(&mut u.path), &around);
                    }
                    continue;
                }
                "mod" => {
                    if let Some(Token::Ident(name)) = t.get(i + 1) {
                        let body = is_punct(t.get(i + 2), '{');
                        let path = path_attr.take();
                        parsed.mods.push(ModDecl {
                            name: name.clone(),
                            inline: body,
                            path,
                        });
                        if body {
                            inline.push((name.clone(), after_group(t, i + 2)));
                        }
                    }
                    // A declaration names no module in code.
                    i += 2;
                    continue;
                }
                "fn" | "struct" | "enum" | "trait" | "type" | "const" | "static" | "union" => {
                    if let Some(Token::Ident(name)) = t.get(i + 1) {
                        parsed.defines.insert(name.clone());
                    }
                }
                "macro_rules" if is_punct(t.get(i + 1), '!') => {
                    if let Some(Token::Ident(name)) = t.get(i + 2) {
                        parsed.defines.insert(name.clone());
                        if std::mem::take(&mut export) {
                            parsed.exported_macros.push(name.clone());
                        }
                    }
                }
                _ => {}
            }
            parsed.idents.insert(ident.to_owned());
            let continues = i > 0 && t[i - 1] == Token::PathSep;
            if !continues && t.get(i + 1) == Some(&Token::PathSep) {
                let mut path = vec![ident.to_owned()];
                let mut j = i + 1;
                while t.get(j) == Some(&Token::PathSep) {
                    let Some(Token::Ident(next)) = t.get(j + 1) else {
                        break;
                    };
                    path.push(next.clone());
                    j += 2;
                }
                if path.len() > 1 {
                    parsed.paths.push(from_file(path, &around));
                }
            }
            i += 1;
        }
        parsed
    }

    /// Whether the file declares modules in files of their own: a module root, whose `use`
    /// declarations only bind names (for its own code and for its children).
    pub(super) fn is_root(&self) -> bool {
        self.mods.iter().any(|m| !m.inline)
    }
}

/// `path`, written inside the inline modules `inline` (outermost first) of a file, as seen from
/// the file's own module: there `self` is the innermost inline module and `super` its parent
/// (`mod x86 { use super::f; }` names the file's own `f`).
fn from_file(path: Vec<String>, inline: &[String]) -> Vec<String> {
    let ups = path.iter().take_while(|s| *s == "super").count();
    let head = path.first().map(String::as_str);
    if inline.is_empty() || (ups == 0 && head != Some("self")) {
        return path;
    }
    let rest = &path[ups.max(1)..];
    let (start, down): (Vec<String>, &[String]) = if ups > inline.len() {
        (vec!["super".to_owned(); ups - inline.len()], &[])
    } else {
        (vec!["self".to_owned()], &inline[..inline.len() - ups])
    };
    start
        .into_iter()
        .chain(down.iter().cloned())
        .chain(rest.iter().cloned())
        .collect()
}

/// Whether the item whose keyword is at `i` is `pub` or `pub(…)`.
fn is_public(t: &[Token], i: usize) -> bool {
    let Some(before) = i.checked_sub(1) else {
        return false;
    };
    if !is_punct(t.get(before), ')') {
        return is(t.get(before), "pub");
    }
    let mut depth = 0;
    for j in (0..=before).rev() {
        match t[j] {
            Token::Punct(')') => depth += 1,
            Token::Punct('(') => depth -= 1,
            _ => {}
        }
        if depth == 0 {
            return j > 0 && is(t.get(j - 1), "pub");
        }
    }
    false
}

/// Parses the use tree that starts at `i` below `prefix` into `out`; returns the index after it
/// (after the `;` at the top level).
fn use_tree(
    t: &[Token],
    mut i: usize,
    prefix: &[String],
    public: bool,
    out: &mut Vec<Use>,
) -> usize {
    let mut path = prefix.to_vec();
    if prefix.is_empty() && t.get(i) == Some(&Token::PathSep) {
        // `use ::std::x`: another crate, whose path starts with an empty segment.
        path.push(String::new());
        i += 1;
    }
    loop {
        match t.get(i) {
            Some(Token::Ident(segment)) => {
                path.push(segment.clone());
                i += 1;
                if t.get(i) == Some(&Token::PathSep) {
                    i += 1;
                    continue;
                }
                let mut name = path.last().cloned();
                if is(t.get(i), "as") {
                    if let Some(Token::Ident(alias)) = t.get(i + 1) {
                        name = Some(alias.clone());
                    }
                    i += 2;
                }
                if path.last().map(String::as_str) == Some("self") {
                    path.pop();
                    if name.as_deref() == Some("self") {
                        name = path.last().cloned();
                    }
                }
                out.push(Use { public, path, name });
                break;
            }
            Some(Token::Punct('*')) => {
                out.push(Use {
                    public,
                    path,
                    name: None,
                });
                i += 1;
                break;
            }
            Some(Token::Punct('{')) => {
                i += 1;
                while i < t.len() && !is_punct(t.get(i), '}') {
                    let next = use_tree(t, i, &path, public, out);
                    i = if is_punct(t.get(next), ',') || next == i {
                        next + 1
                    } else {
                        next
                    };
                }
                i += 1;
                break;
            }
            _ => break,
        }
    }
    if prefix.is_empty() {
        while i < t.len() && !is_punct(t.get(i), ';') {
            i += 1;
        }
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idents(text: &str) -> Vec<String> {
        tokens(text)
            .into_iter()
            .filter_map(|t| match t {
                Token::Ident(s) => Some(s),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn comments_and_literals_hide_their_words() {
        let text = "a // b\n/* c /* d */ e */ f \"g \\\" h\" r#\"i\"# b\"j\" 'k' '\\'' 'l m";
        assert_eq!(idents(text), ["a", "f", "l", "m"]);
        let strs: Vec<Token> = tokens("x(\"a\\\"b\", r#\"c\"d\"#)")
            .into_iter()
            .filter(|t| matches!(t, Token::Str(_)))
            .collect();
        assert_eq!(
            strs,
            [Token::Str("a\\\"b".into()), Token::Str("c\"d".into())]
        );
        assert!(
            tokens("0xcbf2_9ce4_8422_2325u64 1.5")
                .contains(&Token::Number("0xcbf2_9ce4_8422_2325u64".into()))
        );
    }

    #[test]
    fn test_only_items_are_left_out() {
        let text = "use a::B;\n#[cfg(test)]\nmod tests { use c::D; }\n#[cfg(test)]\nuse e::F;\n\
                    #[cfg(all(test, unix))]\n#[allow(x)]\nfn g() { h::i(); }\n\
                    #[cfg(not(test))]\nuse j::K;\n";
        let parsed = Parsed::of(&tokens(text));
        let paths: Vec<String> = parsed.uses.iter().map(|u| u.path.join("::")).collect();
        assert_eq!(paths, ["a::B", "j::K"]);
        assert!(parsed.paths.is_empty(), "{:?}", parsed.paths);
        assert!(
            Parsed::of(&tokens("#![cfg(test)]\nuse a::B;"))
                .uses
                .is_empty()
        );
    }

    #[test]
    fn use_trees_expand_into_one_name_each() {
        let text = "pub(crate) use crate::{a::{self, B as C}, d::*};\nuse ::std::e;\n\
                    pub struct S;\nuse f;\n";
        let uses = Parsed::of(&tokens(text)).uses;
        let got: Vec<(bool, String, Option<&str>)> = uses
            .iter()
            .map(|u| (u.public, u.path.join("::"), u.name.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                (true, "crate::a".to_owned(), Some("a")),
                (true, "crate::a::B".to_owned(), Some("C")),
                (true, "crate::d".to_owned(), None),
                (false, "::std::e".to_owned(), Some("e")),
                (false, "f".to_owned(), Some("f")),
            ]
        );
    }

    #[test]
    fn self_and_super_in_an_inline_module_start_from_it() {
        let text = "mod simd {\n    use super::{Sums, gradients};\n    fn f() { self::g(); }\n\
                    mod deeper { fn h() { super::super::super::x::y(); } }\n}\n\
                    fn k() { super::z(); }\n";
        let parsed = Parsed::of(&tokens(text));
        let uses: Vec<String> = parsed.uses.iter().map(|u| u.path.join("::")).collect();
        assert_eq!(uses, ["self::Sums", "self::gradients"]);
        let paths: Vec<String> = parsed.paths.iter().map(|p| p.join("::")).collect();
        assert_eq!(paths, ["self::simd::g", "super::x::y", "super::z"]);
    }

    #[test]
    fn mods_items_paths_and_exported_macros_are_found() {
        let text = "mod a;\n#[path = \"x.rs\"]\nmod b;\npub mod c { }\npub struct S;\n\
                    #[macro_export]\nmacro_rules! m { () => { $crate::a::f() } }\n\
                    fn g() -> S { crate::a::b::h(); super::i(); let v = Vec::<u8>::new(); \
                    ::std::j::k(); crate::m!(); }\n";
        let parsed = Parsed::of(&tokens(text));
        assert_eq!(
            parsed.mods,
            [
                ModDecl {
                    name: "a".into(),
                    inline: false,
                    path: None
                },
                ModDecl {
                    name: "b".into(),
                    inline: false,
                    path: Some("x.rs".into())
                },
                ModDecl {
                    name: "c".into(),
                    inline: true,
                    path: None
                },
            ]
        );
        assert!(parsed.is_root());
        let paths: Vec<String> = parsed.paths.iter().map(|p| p.join("::")).collect();
        assert_eq!(
            paths,
            ["$crate::a::f", "crate::a::b::h", "super::i", "crate::m"]
        );
        assert_eq!(parsed.exported_macros, ["m"]);
        assert!(["S", "m", "g"].iter().all(|d| parsed.defines.contains(*d)));
        assert!(parsed.idents.contains("S"));
    }
}
