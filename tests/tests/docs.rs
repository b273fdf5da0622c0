//! The documents against the code: `docs/contract.md` lists exactly the
//! fields and reason codes the code has, and nothing in the repository's
//! documents points outside it.

use std::collections::BTreeSet;

use inferlog_schema::contract::FIELDS;
use inferlog_schema::ReasonCode;
use inferlog_tests::repo_root;

fn contract() -> String {
    std::fs::read_to_string(repo_root().join("docs/contract.md")).expect("docs/contract.md")
}

/// The first column (a `code` span) of every row of the table under `heading`.
fn first_column(text: &str, heading: &str) -> BTreeSet<String> {
    let section = text.split(heading).nth(1).unwrap_or_else(|| panic!("{heading} in docs/contract.md"));
    let section = section.split("\n#").next().unwrap_or(section);
    section.lines().filter_map(|l| l.strip_prefix("| `")).filter_map(|l| l.split_once('`').map(|(name, _)| name.to_owned())).collect()
}

#[test]
fn the_contract_lists_every_field_and_no_other() {
    let documented = first_column(&contract(), "## 1. The event");
    let code: BTreeSet<String> = FIELDS.iter().map(|f| f.name.to_owned()).collect();
    assert_eq!(documented, code, "fields in docs/contract.md vs the code");
}

/// The OTLP mapping table lists, per field, the attributes the mapper
/// reads, in its order (the backticked names of the second column).
#[test]
fn the_contract_maps_span_attributes_as_the_code_does() {
    let text = contract();
    let section = text.split("### OTLP spans").nth(1).expect("an OTLP spans section");
    let section = section.split("\n#").next().unwrap_or(section);
    let documented: Vec<(String, Vec<String>)> = section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| {
            let (field, rest) = l.split_once('`')?;
            let attributes = rest.split('|').nth(1)?;
            // Only names that contain a dot are attributes (not `[otlp]` keys).
            let names = attributes.split('`').skip(1).step_by(2).filter(|n| n.contains('.')).map(str::to_owned).collect();
            Some((field.to_owned(), names))
        })
        .filter(|(_, names): &(String, Vec<String>)| !names.is_empty())
        .collect();
    let code: Vec<(String, Vec<String>)> = inferlog_ingest::otlp::map::BUILT_IN
        .iter()
        .map(|(field, names)| ((*field).to_owned(), names.iter().map(|n| (*n).to_owned()).collect()))
        .collect();
    let documented_map: std::collections::BTreeMap<_, _> = documented.into_iter().collect();
    for (field, names) in &code {
        let doc = documented_map.get(field).unwrap_or_else(|| panic!("{field} missing from the OTLP table"));
        assert!(doc.starts_with(names), "{field}: docs/contract.md says {doc:?}, the mapper reads {names:?}");
    }
}

#[test]
fn the_contract_lists_every_reason_code_and_no_other() {
    let documented = first_column(&contract(), "## 2. Reason codes");
    let code: BTreeSet<String> = ReasonCode::ALL.iter().map(|r| r.as_str().to_owned()).collect();
    assert_eq!(documented, code, "reason codes in docs/contract.md vs the code");
}

#[test]
fn the_exit_code_table_matches_the_code() {
    use inferlog_schema::error::exit;
    let documented = first_column(&contract(), "Every command uses one exit code table");
    assert!(documented.is_empty(), "exit codes are plain numbers");
    let text = contract();
    for code in [exit::OK, exit::PROBLEMS, exit::PERMANENT, exit::TRANSIENT, exit::BUG] {
        assert!(text.contains(&format!("\n| {code} |")), "exit code {code} in the table");
    }
}

#[test]
fn no_document_points_outside_the_repository() {
    let root = repo_root();
    let mut documents = vec![root.join("README.md"), root.join("CHANGELOG.md")];
    for dir in ["docs", "deploy"] {
        for entry in std::fs::read_dir(root.join(dir)).expect("dir").flatten() {
            if entry.path().extension().is_some_and(|e| e == "md") {
                documents.push(entry.path());
            }
        }
    }
    for doc in documents {
        let text = std::fs::read_to_string(&doc).unwrap_or_default();
        assert!(!text.contains("../shared") && !text.contains("SPEC.md"), "{} refers to a file outside the repository", doc.display());
    }
}
