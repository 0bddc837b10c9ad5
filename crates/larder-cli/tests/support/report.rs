//! Reading what the `bench` commands write: the texts of an SVG plot, and the rows of
//! a Markdown table.

/// Every `<text>` of an SVG, after checking that it parses and is an SVG.
pub fn svg_texts(svg: &str, name: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse(svg).unwrap_or_else(|e| panic!("{name}: not XML: {e}"));
    assert_eq!(doc.root_element().tag_name().name(), "svg", "{name}");
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text().map(|t| t.trim().to_string()))
        .collect()
}

/// The rows of the Markdown table that follows `heading` in `report` (header and rule
/// left out), as cells.
pub fn table_after(report: &str, heading: &str) -> Vec<Vec<String>> {
    let at = report
        .find(heading)
        .unwrap_or_else(|| panic!("no {heading:?} in the report"));
    report[at..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}
