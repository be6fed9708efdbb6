//! The README's copy of the linear-regression example's training loop (a `rust,ignore` block:
//! it needs the example's data and arguments around it) must stay what the example runs. The
//! README's other Rust blocks are doc tests of this crate (`ReadmeDoctests` in lib.rs).

const README: &str = include_str!("../../../README.md");
const EXAMPLE: &str = include_str!("../examples/linear_regression.rs");
const MARKER: &str = "// From crates/distribute/examples/linear_regression.rs";

/// The lines of the README's block copied from the example, without the marker line.
fn copied_block() -> Vec<&'static str> {
    let start = README
        .find(MARKER)
        .expect("the README quotes the linear-regression example under its marker comment");
    let block = &README[start..];
    let end = block.find("```").expect("the quoted block is closed");
    block[..end].lines().skip(1).collect()
}

/// Where each non-blank line of `copy` appears in `source`, in order, comparing trimmed lines
/// (the README may indent the loop differently); the first line that does not, as an error.
fn find_in_order(copy: &[&str], source: &str) -> Result<(), String> {
    let mut rest = source.lines().map(str::trim);
    for line in copy.iter().map(|l| l.trim()).filter(|l| !l.is_empty()) {
        if !rest.any(|s| s == line) {
            return Err(line.to_owned());
        }
    }
    Ok(())
}

#[test]
fn the_readme_quotes_the_example_as_it_is() {
    let copy = copied_block();
    assert!(copy.len() > 20, "the quoted block is the training loop");
    if let Err(line) = find_in_order(&copy, EXAMPLE) {
        panic!(
            "README.md quotes a line that linear_regression.rs does not have (in this order): \
             {line:?}; update the README's copy"
        );
    }
}

#[test]
fn a_changed_line_is_noticed() {
    let copy = copied_block();
    let mut changed = copy.clone();
    let i = changed
        .iter()
        .position(|l| l.contains("all_reduce"))
        .expect("the loop all-reduces");
    changed[i] = "let (grad_w, rest) = ctx.all_reduce(ReduceOp::Mean, &sums)?;";
    assert!(find_in_order(&changed, EXAMPLE).is_err());
    // Lines in another order are a change too.
    let mut reordered = copy.clone();
    let last = reordered.len() - 1;
    reordered.swap(1, last);
    assert!(find_in_order(&reordered, EXAMPLE).is_err());
}
