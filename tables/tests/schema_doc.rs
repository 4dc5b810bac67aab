//! SCHEMAS.md documents every table's columns exactly as the export writes
//! them: a column added, renamed, retyped or redescribed in `schema.rs`
//! without its documentation fails here (and the message holds the text to
//! paste).

#[test]
fn schemas_md_documents_every_column_of_every_table() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../schemas/SCHEMAS.md");
    let md = std::fs::read_to_string(path).expect("read SCHEMAS.md");
    let begin = "<!-- tables:begin -->\n";
    let end = "<!-- tables:end -->";
    let start = md
        .find(begin)
        .expect("SCHEMAS.md has the tables:begin marker")
        + begin.len();
    let stop = md[start..].find(end).expect("tables:end marker") + start;
    let want = tables::schema::markdown();
    assert!(
        md[start..stop] == want,
        "SCHEMAS.md's tables section differs from tables/src/schema.rs; it should read:\n{want}"
    );
}

#[test]
fn column_names_are_unique_and_every_table_names_its_run() {
    for t in tables::schema::TABLES {
        let mut names: Vec<&str> = t.columns.iter().map(|c| c.name).collect();
        assert_eq!(names.first(), Some(&"run"), "{} starts with run", t.name);
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "{} has a duplicate column", t.name);
    }
}
