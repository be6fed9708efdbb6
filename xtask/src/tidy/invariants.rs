//! The invariants' prose: `docs/architecture.md`'s "Invariants" section says, for every
//! workspace crate, what it knows nothing about, one bullet `- **<short>** — …` each. A crate
//! added without its bullet, or a bullet left behind by a removed crate, fails.

use super::ARCHITECTURE_DOC;

/// The heading that opens the section; the next `## ` heading closes it.
const SECTION: &str = "## Invariants";
/// The workspace's package prefix, which the bullets leave out.
const PREFIX: &str = "distribute-";

/// The name a bullet gives `package`: the package name without the workspace's prefix
/// (`distribute-mirrored` → `mirrored`; `distribute`, `xtask` as they are).
fn short_name(package: &str) -> &str {
    package.strip_prefix(PREFIX).unwrap_or(package)
}

/// The `<short>` of every bullet `- **<short>** — …` in the "Invariants" section of the markdown
/// `text`, in order; lines that continue a bullet (indented) are skipped.
fn parse_bullets(text: &str) -> Result<Vec<String>, String> {
    let mut lines = text.lines().skip_while(|line| !line.starts_with(SECTION));
    if lines.next().is_none() {
        return Err(format!("no `{SECTION}` section"));
    }
    let mut bullets = Vec::new();
    for line in lines.take_while(|line| !line.starts_with("## ")) {
        if !line.starts_with("- ") {
            continue;
        }
        let short = line
            .strip_prefix("- **")
            .and_then(|rest| rest.split_once("** — "))
            .map(|(short, _)| short)
            .filter(|short| !short.is_empty() && !short.contains(char::is_whitespace))
            .ok_or_else(|| format!("an invariants bullet must read `- **<crate>** — …`: {line}"))?;
        bullets.push(short.to_owned());
    }
    if bullets.is_empty() {
        return Err(format!("the `{SECTION}` section has no bullets"));
    }
    Ok(bullets)
}

/// Every difference between the workspace's `packages` and the invariants' `bullets`, as
/// readable lines.
fn invariants_violations(packages: &[&str], bullets: &[String]) -> Vec<String> {
    let mut violations = Vec::new();
    for package in packages {
        let short = short_name(package);
        match bullets.iter().filter(|bullet| *bullet == short).count() {
            0 => violations.push(format!(
                "{ARCHITECTURE_DOC}: crate `{package}` has no invariants bullet `- **{short}** — …`"
            )),
            1 => {}
            n => violations.push(format!(
                "{ARCHITECTURE_DOC}: crate `{package}` has {n} invariants bullets \
                 `- **{short}** — …`: keep one"
            )),
        }
    }
    for bullet in bullets {
        if !packages.iter().any(|package| short_name(package) == bullet) {
            violations.push(format!(
                "{ARCHITECTURE_DOC}: invariants bullet `- **{bullet}** — …` names no workspace \
                 crate (`{PREFIX}{bullet}` or `{bullet}`): remove it or add the crate"
            ));
        }
    }
    violations
}

#[test]
fn every_crate_has_an_invariants_bullet_and_every_bullet_a_crate() {
    let packages = super::workspace_packages();
    let names: Vec<&str> = packages.iter().map(|p| p.name.as_str()).collect();
    let bullets = parse_bullets(&super::architecture_doc())
        .unwrap_or_else(|err| panic!("{ARCHITECTURE_DOC}: {err}"));
    let violations = invariants_violations(&names, &bullets);
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn the_invariants_parse_and_the_check_catches_each_kind_of_violation() {
    let text = "# Doc\n\n- **not** — a bullet before the section\n\n\
                ## Invariants: what each crate knows nothing about\n\n\
                - **a** — knows nothing; a bullet may run\n  over several lines.\n\
                - **distribute** — the facade.\n\
                - **xtask** — the runner.\n\
                - **twice** — once,\n\
                - **twice** — and again.\n\
                - **ghost** — its crate is gone.\n\n\
                ## API boundaries\n\n- **API boundaries** — another section's bullet.\n";
    let bullets = parse_bullets(text).unwrap();
    assert_eq!(
        bullets,
        ["a", "distribute", "xtask", "twice", "twice", "ghost"]
    );
    let packages = [
        "distribute-a",
        "distribute",
        "xtask",
        "distribute-twice",
        "distribute-new",
    ];
    let violations = invariants_violations(&packages, &bullets);
    let expected = [
        "docs/architecture.md: crate `distribute-twice` has 2 invariants bullets `- **twice** — …`",
        "docs/architecture.md: crate `distribute-new` has no invariants bullet `- **new** — …`",
        "docs/architecture.md: invariants bullet `- **ghost** — …` names no workspace crate",
    ];
    super::assert_violations(&violations, &expected);

    assert!(parse_bullets("# no section\n- **a** — x\n").is_err());
    assert!(parse_bullets("## Invariants\n\nprose only\n").is_err());
    let no_dash = "## Invariants\n\n- **a**: knows nothing\n";
    assert!(parse_bullets(no_dash).unwrap_err().contains("must read"));
}
