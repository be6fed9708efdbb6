//! One copy of the code that must agree wherever it runs: the tree holds one FNV-1a
//! implementation (the hash of the collectives' agreement records, which every process must
//! compute alike) and one dtype dispatch macro (`with_dtype!`, which every new `DType` variant
//! must reach). Every `.rs` file of every workspace package counts, tests included; a copy is
//! found by what it must contain ([`Single::holds`]), whatever its name.

use std::path::Path;

use super::source::{Token, tokens};

/// Something the tree must hold once.
struct Single {
    /// What it is, in messages.
    what: &'static str,
    /// The file that holds it, below the workspace root.
    home: &'static str,
    /// What a copy should use instead.
    instead: &'static str,
    /// Whether a file's tokens hold it.
    holds: fn(&[Token]) -> bool,
    /// The copies the tree had when this check came (issue 37), below the workspace root. They
    /// are being removed: the test fails when one is gone (delete its line: the list only
    /// shrinks) and when a copy appears that is not here.
    copies_today: &'static [&'static str],
}

const SINGLES: &[Single] = &[
    Single {
        what: "FNV-1a (its offset basis or prime)",
        home: "crates/tensor/src/fnv.rs",
        instead: "use distribute_tensor::Fnv",
        holds: holds_fnv,
        copies_today: &[],
    },
    Single {
        what: "dtype dispatch macro (a `macro_rules!` named with_dtype or matching DType's variants)",
        home: "crates/tensor/src/dtype.rs",
        instead: "use distribute_tensor::with_dtype",
        holds: holds_dtype_macro,
        copies_today: &[],
    },
];

/// FNV-1a's 64-bit offset basis and prime, in hex (as text, so that this file holds neither).
const FNV_CONSTANTS: [&str; 2] = ["cbf29ce484222325", "100000001b3"];

/// The value of an integer literal (`0xcbf2_9ce4_8422_2325u64`, `1_099_511_628_211`), in hex.
fn hex_value(literal: &str) -> Option<String> {
    let digits: String = literal.chars().filter(|&c| c != '_').collect();
    let digits = digits.to_ascii_lowercase();
    let (radix, digits) = match digits.get(..2) {
        Some("0x") => (16, &digits[2..]),
        Some("0o") => (8, &digits[2..]),
        Some("0b") => (2, &digits[2..]),
        _ => (10, digits.as_str()),
    };
    let suffix = [
        "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32", "i64", "i128", "isize",
    ];
    let digits = suffix
        .iter()
        .find_map(|s| digits.strip_suffix(s))
        .unwrap_or(digits);
    u128::from_str_radix(digits, radix)
        .ok()
        .map(|v| format!("{v:x}"))
}

fn holds_fnv(tokens: &[Token]) -> bool {
    tokens.iter().any(|token| match token {
        Token::Number(literal) => {
            hex_value(literal).is_some_and(|v| FNV_CONSTANTS.contains(&v.as_str()))
        }
        _ => false,
    })
}

/// How many of `DType`'s variants a macro's arms must name to be a dispatch over them.
const DISPATCH_VARIANTS: usize = 4;

fn holds_dtype_macro(tokens: &[Token]) -> bool {
    let mut i = 0;
    while i + 3 < tokens.len() {
        let is_macro =
            tokens[i] == Token::Ident("macro_rules".into()) && tokens[i + 1] == Token::Punct('!');
        let (true, Token::Ident(name)) = (is_macro, &tokens[i + 2]) else {
            i += 1;
            continue;
        };
        let mut depth = 0;
        let mut end = i + 3;
        for (j, token) in tokens.iter().enumerate().skip(i + 3) {
            match token {
                Token::Punct('{' | '(' | '[') => depth += 1,
                Token::Punct('}' | ')' | ']') => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                end = j;
                break;
            }
        }
        let body = &tokens[i + 3..=end.min(tokens.len() - 1)];
        let mut variants: Vec<&str> = body
            .windows(3)
            .filter_map(|w| match w {
                [Token::Ident(ty), Token::PathSep, Token::Ident(variant)] if ty == "DType" => {
                    Some(variant.as_str())
                }
                _ => None,
            })
            .collect();
        variants.sort_unstable();
        variants.dedup();
        if name.contains("with_dtype") || variants.len() >= DISPATCH_VARIANTS {
            return true;
        }
        i = end + 1;
    }
    false
}

/// What is wrong with `files` (path below the workspace root, text) for `single`.
fn copy_violations(single: &Single, files: &[(String, String)]) -> Vec<String> {
    let holders: Vec<&str> = files
        .iter()
        .filter(|(_, text)| (single.holds)(&tokens(text)))
        .map(|(path, _)| path.as_str())
        .collect();
    let mut violations = Vec::new();
    if !holders.contains(&single.home) {
        violations.push(format!(
            "{}: holds no {}, and it is its home: say where it went",
            single.home, single.what
        ));
    }
    for copy in holders
        .iter()
        .filter(|h| **h != single.home && !single.copies_today.contains(h))
    {
        violations.push(format!(
            "{copy}: a second {}; {} instead",
            single.what, single.instead
        ));
    }
    for gone in single.copies_today.iter().filter(|c| !holders.contains(c)) {
        violations.push(format!(
            "{gone}: holds no {} any more: remove it from the copies of today",
            single.what
        ));
    }
    violations
}

/// Every `.rs` file of every workspace package, with its path below the workspace root.
fn workspace_sources() -> Vec<(String, String)> {
    let root = super::workspace_root();
    let mut paths = Vec::new();
    for package in super::workspace_packages() {
        let dir = package.manifest.parent().unwrap();
        for sub in ["src", "tests", "benches", "examples"] {
            super::rust_files(&dir.join(sub), &mut paths);
        }
        paths.push(dir.join("build.rs"));
    }
    paths.sort();
    paths.dedup();
    paths
        .iter()
        .filter_map(|path| {
            let text = std::fs::read_to_string(path).ok()?;
            let shown = path.strip_prefix(&root).unwrap_or(Path::new(path));
            Some((shown.to_string_lossy().replace('\\', "/"), text))
        })
        .collect()
}

#[test]
fn the_tree_holds_one_fnv_and_one_dtype_dispatch_but_todays_copies() {
    let files = workspace_sources();
    let violations: Vec<String> = SINGLES
        .iter()
        .flat_map(|single| copy_violations(single, &files))
        .collect();
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn copies_are_found_whatever_their_names_and_digit_groupings() {
    let single = |holds| Single {
        what: "thing",
        home: "home.rs",
        instead: "use the home's",
        holds,
        copies_today: &["old.rs"],
    };
    let fnv = single(holds_fnv);
    let file = |path: &str, text: &str| (path.to_owned(), text.to_owned());
    let files = [
        file("home.rs", "fn new() -> Fnv { Fnv(0xcbf2_9ce4_8422_2325) }"),
        file("old.rs", "const P: u64 = 0x0000_0100_0000_01B3;"),
        file("decimal.rs", "let h = 14695981039346656037u64;"),
        file("prime.rs", "h.wrapping_mul(0x100000001b3)"),
        file(
            "comment.rs",
            "// FNV: 0xcbf29ce484222325\nlet s = \"0x100000001b3\";",
        ),
    ];
    super::assert_violations(
        &copy_violations(&fnv, &files),
        &[
            "decimal.rs: a second thing; use the home's instead",
            "prime.rs: a second thing",
        ],
    );
    let moved = [
        file("elsewhere.rs", "0xcbf29ce484222325"),
        file("old.rs", ""),
    ];
    super::assert_violations(
        &copy_violations(&fnv, &moved),
        &[
            "home.rs: holds no thing, and it is its home",
            "elsewhere.rs: a second thing",
            "old.rs: holds no thing any more",
        ],
    );

    let dispatch = single(holds_dtype_macro);
    let arms = "DType::F32 => { type $t = f32; $b } DType::F64 => { type $t = f64; $b } \
                DType::I32 => { type $t = i32; $b } DType::I64 => { type $t = i64; $b }";
    let files = [
        file(
            "home.rs",
            "#[macro_export]\nmacro_rules! __with_dtype { ($d:expr) => { 1 } }",
        ),
        file(
            "old.rs",
            &format!(
                "macro_rules! typed {{ ($d:expr, $t:ident => $b:expr) => {{ match $d {{ {arms} }} }} }}"
            ),
        ),
        file(
            "other.rs",
            &format!(
                "macro_rules! each {{ () => {{ 1 }} }}\nfn f(d: DType) {{ match d {{ {arms} }} }}"
            ),
        ),
        file("renamed.rs", "macro_rules! my_with_dtype { () => {} }"),
    ];
    super::assert_violations(
        &copy_violations(&dispatch, &files),
        &["renamed.rs: a second thing"],
    );
}
