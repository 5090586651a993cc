//! The API reference, `docs/reference.md`, rendered from the CRDs' OpenAPI schemas: every
//! field with its type, default, validation (required, enums, ranges, lengths, patterns, CEL
//! rules) and description, which are the doc comments of the types in this module's parent —
//! the texts `kubectl explain` shows. `crdref` prints it; a unit test fails when the committed
//! file is stale, as one does for `crds/`.

use std::fmt::Write as _;

use serde_json::Value;

/// The command that writes the reference, named in its header and in the staleness test.
pub const COMMAND: &str = "cargo run --bin crdref > docs/reference.md";

/// Renders the reference of every CRD [`super::all`] returns, in that order.
pub fn render_markdown() -> Result<String, serde_json::Error> {
    let crds = super::all()
        .into_iter()
        .map(serde_json::to_value)
        .collect::<Result<Vec<_>, _>>()?;
    let mut out = String::new();
    let _ = writeln!(out, "# API reference\n");
    let _ = writeln!(
        out,
        "The resources of the API group `{}`, version `{}`, generated from the CRDs \
         (`{COMMAND}`; a unit test fails when this file is stale). Every description is the \
         one `kubectl explain` shows; every validation is enforced by the API server at \
         admission.\n",
        super::GROUP,
        super::VERSION
    );
    for crd in &crds {
        let kind = text(&crd["spec"]["names"]["kind"]);
        let _ = writeln!(out, "- [{kind}](#{})", slug(&kind));
    }
    for crd in &crds {
        out.push('\n');
        kind_section(&mut out, crd);
    }
    Ok(out)
}

/// One kind: what it is, its names, subresources and columns, then each of its objects.
fn kind_section(out: &mut String, crd: &Value) {
    let names = &crd["spec"]["names"];
    let kind = text(&names["kind"]);
    let version = &crd["spec"]["versions"][0];
    let schema = &version["schema"]["openAPIV3Schema"];
    let _ = writeln!(out, "## {kind}\n");
    let _ = writeln!(out, "{}\n", prose(&text(&schema["description"])));
    let list = |v: &Value| {
        v.as_array()
            .map(|a| {
                a.iter()
                    .map(|x| format!("`{}`", text(x)))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "—".into())
    };
    let mut subresources: Vec<String> = Vec::new();
    if let Some(s) = version["subresources"].as_object() {
        if s.contains_key("status") {
            subresources.push("`status`".into());
        }
        if let Some(scale) = s.get("scale") {
            subresources.push(format!(
                "`scale` (replicas `{}`, status `{}`, selector `{}`)",
                text(&scale["specReplicasPath"]),
                text(&scale["statusReplicasPath"]),
                text(&scale["labelSelectorPath"])
            ));
        }
    }
    let _ = writeln!(out, "| | |\n|---|---|");
    let _ = writeln!(
        out,
        "| API version | `{}/{}` |",
        text(&crd["spec"]["group"]),
        text(&version["name"])
    );
    let _ = writeln!(out, "| scope | {} |", text(&crd["spec"]["scope"]));
    let _ = writeln!(out, "| plural | `{}` |", text(&names["plural"]));
    let _ = writeln!(out, "| short names | {} |", list(&names["shortNames"]));
    let _ = writeln!(out, "| categories | {} |", list(&names["categories"]));
    let _ = writeln!(
        out,
        "| subresources | {} |\n",
        if subresources.is_empty() {
            "—".into()
        } else {
            subresources.join(", ")
        }
    );
    if let Some(columns) = version["additionalPrinterColumns"].as_array() {
        let _ = writeln!(
            out,
            "`kubectl get` columns (`-o wide` adds those marked wide):\n"
        );
        let _ = writeln!(out, "| column | JSON path | type | description |");
        let _ = writeln!(out, "|---|---|---|---|");
        for c in columns {
            let wide = if c["priority"].as_i64().unwrap_or(0) > 0 {
                " (wide)"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "| {}{wide} | {} | {} | {} |",
                text(&c["name"]),
                code(&text(&c["jsonPath"])),
                text(&c["type"]),
                c["description"].as_str().map_or("—".into(), cell)
            );
        }
        out.push('\n');
    }
    object_sections(out, &kind, schema);
}

/// The table of an object's fields, then the sections of the objects among them, depth first.
/// `path` is the object's path from the kind (`Sandbox.spec.workspace`, `files[]` for the
/// items of a list).
fn object_sections(out: &mut String, path: &str, schema: &Value) {
    let Some(fields) = schema["properties"].as_object() else {
        return;
    };
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if path.contains('.') {
        let _ = writeln!(out, "### {path}\n");
        let description = text(&schema["description"]);
        if !description.is_empty() {
            let _ = writeln!(out, "{}\n", prose(&description));
        }
        let rules = rules(schema);
        if !rules.is_empty() {
            let _ = writeln!(out, "Rules:\n");
            for r in rules {
                let _ = writeln!(out, "- {r}");
            }
            out.push('\n');
        }
    }
    let _ = writeln!(out, "| field | type | default | validation | description |");
    let _ = writeln!(out, "|---|---|---|---|---|");
    let mut nested = Vec::new();
    for (name, field) in fields {
        let child = match object_of(field) {
            Some((suffix, object)) => {
                let child = format!("{path}.{name}{suffix}");
                nested.push((child.clone(), object));
                Some(child)
            }
            None => None,
        };
        let mut checks = Vec::new();
        if required.contains(&name.as_str()) {
            checks.push("required".to_string());
        }
        checks.extend(validation(field));
        // An object's own rules are listed in its section; a list's or a scalar's here.
        if child.is_none() || field["type"] == "array" {
            checks.extend(rules(field));
        }
        let _ = writeln!(
            out,
            "| `{name}` | {} | {} | {} | {} |",
            type_of(field, child.as_deref()),
            field
                .get("default")
                .map_or("—".into(), |d| code(&compact(d))),
            if checks.is_empty() {
                "—".into()
            } else {
                checks.join("; ")
            },
            cell(&text(&field["description"]))
        );
    }
    out.push('\n');
    for (child, object) in nested {
        object_sections(out, &child, object);
    }
}

/// The object a field holds, with the path suffix of its section: the field's own object, or
/// the items of a list of objects (`[]`), or the values of a map of objects (`{}`).
fn object_of(field: &Value) -> Option<(&'static str, &Value)> {
    let has_fields = |v: &Value| v["properties"].is_object();
    if has_fields(field) {
        return Some(("", field));
    }
    if has_fields(&field["items"]) {
        return Some(("[]", &field["items"]));
    }
    if has_fields(&field["additionalProperties"]) {
        return Some(("{}", &field["additionalProperties"]));
    }
    None
}

/// A field's type as Go-like text (`[]string`, `map[string]string`, `integer (int32)`),
/// linked to its section when it holds an object.
fn type_of(field: &Value, section: Option<&str>) -> String {
    let plain = plain_type(field);
    match section {
        Some(s) => format!(
            "[{}](#{})",
            plain.replace('[', "\\[").replace(']', "\\]"),
            slug(s)
        ),
        None => plain,
    }
}

fn plain_type(field: &Value) -> String {
    if field["x-kubernetes-int-or-string"] == true {
        return "int-or-string".into();
    }
    match field["type"].as_str() {
        Some("array") => format!("[]{}", plain_type(&field["items"])),
        Some("object") if field["additionalProperties"].is_object() => {
            format!("map[string]{}", plain_type(&field["additionalProperties"]))
        }
        Some(t) => match field["format"].as_str() {
            Some(f) => format!("{t} ({f})"),
            None => t.to_string(),
        },
        None => "any".into(),
    }
}

/// The checks of the schema keywords on a field, in words.
fn validation(field: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(values) = field["enum"].as_array() {
        let values: Vec<String> = values.iter().map(|v| code(&compact(v))).collect();
        out.push(format!("one of {}", values.join(", ")));
    }
    let bound = |low: &str, high: &str, what: &str| -> Option<String> {
        let (lo, hi) = (field.get(low).map(compact), field.get(high).map(compact));
        match (lo, hi) {
            (Some(l), Some(h)) => Some(format!("{what}{l} to {h}")),
            (Some(l), None) => Some(format!("{what}≥ {l}")),
            (None, Some(h)) => Some(format!("{what}≤ {h}")),
            (None, None) => None,
        }
    };
    out.extend(bound("minimum", "maximum", ""));
    out.extend(bound("minLength", "maxLength", "length "));
    out.extend(bound("minItems", "maxItems", "items "));
    out.extend(bound("minProperties", "maxProperties", "entries "));
    if let Some(p) = field["pattern"].as_str() {
        out.push(format!("pattern {}", code(p)));
    }
    out
}

/// The CEL rules on a schema node: the rule and the message the API server gives.
fn rules(schema: &Value) -> Vec<String> {
    schema["x-kubernetes-validations"]
        .as_array()
        .map(|rules| {
            rules
                .iter()
                .map(|r| {
                    let message = match (r["message"].as_str(), r["messageExpression"].as_str()) {
                        (Some(m), _) => format!("“{}”", cell(m)),
                        (None, Some(e)) => format!("message {}", code(e)),
                        (None, None) => "“failed rule”".into(),
                    };
                    format!("rule {}: {message}", code(&text(&r["rule"])))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A string value, or "" for anything else.
fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// A value as compact JSON, numbers without a needless `.0` and strings bare.
fn compact(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

/// Inline code that survives a table cell: pipes escaped, backticks fenced by longer runs.
fn code(s: &str) -> String {
    let s = s.replace('|', "\\|");
    let longest = s
        .split(|c| c != '`')
        .map(str::len)
        .max()
        .unwrap_or_default();
    let fence = "`".repeat(longest + 1);
    let pad = if s.starts_with('`') || s.ends_with('`') {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{s}{pad}{fence}")
}

/// A description as one table cell: lines joined, paragraphs split by `<br>`, and outside
/// code spans the characters a table or HTML would take for their own escaped.
fn cell(s: &str) -> String {
    paragraphs(s, "<br>")
}

/// A description as paragraphs of prose (under a heading).
fn prose(s: &str) -> String {
    paragraphs(s, "\n\n")
}

/// The paragraphs of a description, each on one line and escaped, joined by `sep`.
fn paragraphs(s: &str, sep: &str) -> String {
    s.split("\n\n")
        .map(|p| escape_outside_code(&p.split_whitespace().collect::<Vec<_>>().join(" ")))
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join(sep)
}

/// Escapes `|` everywhere (GitHub splits table cells on it even inside code) and `<`, `*`
/// outside code spans (an HTML tag or emphasis there would swallow text).
fn escape_outside_code(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut in_code: Option<usize> = None;
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '`' {
            let mut run = 1;
            while chars.peek() == Some(&'`') {
                chars.next();
                run += 1;
            }
            in_code = match in_code {
                None => Some(run),
                Some(open) if open == run => None,
                open => open,
            };
            out.push_str(&"`".repeat(run));
            continue;
        }
        match (c, in_code) {
            ('|', _) => out.push_str("\\|"),
            ('<', None) => out.push_str("&lt;"),
            ('*', None) => out.push_str("\\*"),
            (c, _) => out.push(c),
        }
    }
    out
}

/// GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces
/// as `-`.
pub fn slug(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            ' ' => Some('-'),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn committed_reference_matches_the_crds() {
        let committed = include_str!("../../../../docs/reference.md");
        let generated = render_markdown().expect("render the reference");
        assert!(
            committed == generated,
            "docs/reference.md is stale: run `{COMMAND}`"
        );
    }

    #[test]
    fn every_section_has_its_own_anchor_and_every_link_one() {
        let doc = render_markdown().unwrap();
        let anchors: Vec<String> = doc
            .lines()
            .filter_map(|l| l.strip_prefix("## ").or_else(|| l.strip_prefix("### ")))
            .map(slug)
            .collect();
        let mut unique = anchors.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), anchors.len(), "two headings share an anchor");
        for link in doc.split("](#").skip(1) {
            let target = &link[..link.find(')').unwrap()];
            assert!(anchors.iter().any(|a| a == target), "no section #{target}");
        }
    }

    #[test]
    fn every_field_of_every_kind_has_a_row() {
        fn count(schema: &Value) -> usize {
            schema["properties"].as_object().map_or(0, |fields| {
                fields
                    .values()
                    .map(|f| 1 + object_of(f).map_or(0, |(_, o)| count(o)))
                    .sum()
            })
        }
        let doc = render_markdown().unwrap();
        let rows = doc.lines().filter(|l| l.starts_with("| `")).count();
        let fields: usize = super::super::all()
            .into_iter()
            .map(|c| count(&serde_json::to_value(c).unwrap()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]))
            .sum();
        // A row per field (the printer columns' rows name no field in code).
        assert_eq!(rows, fields);
        assert!(fields > 250, "{fields}");
    }

    #[test]
    fn types_say_what_a_field_holds() {
        assert_eq!(
            plain_type(&json!({"type": "array", "items": {"type": "string"}})),
            "[]string"
        );
        assert_eq!(
            plain_type(&json!({"type": "object", "additionalProperties": {"type": "string"}})),
            "map[string]string"
        );
        assert_eq!(
            plain_type(&json!({"type": "integer", "format": "int32"})),
            "integer (int32)"
        );
        assert_eq!(
            plain_type(&json!({"x-kubernetes-int-or-string": true, "anyOf": []})),
            "int-or-string"
        );
        let list = json!({"type": "array", "items": {"type": "object", "properties": {"a": {}}}});
        assert_eq!(
            type_of(&list, Some("Sandbox.spec.workspace.files[]")),
            "[\\[\\]object](#sandboxspecworkspacefiles)"
        );
    }

    #[test]
    fn validations_are_words() {
        let field = json!({"enum": ["A", "B"], "minimum": 1.0, "maximum": 1000.0,
                           "maxLength": 253, "pattern": "^a|b$"});
        assert_eq!(
            validation(&field),
            [
                "one of `A`, `B`",
                "1 to 1000",
                "length ≤ 253",
                "pattern `^a\\|b$`"
            ]
        );
        let ruled = json!({"x-kubernetes-validations": [
            {"rule": "self == oldSelf", "message": "scope is immutable"},
            {"rule": "size(self) > 0", "messageExpression": "'empty: ' + self"}]});
        assert_eq!(
            rules(&ruled),
            [
                "rule `self == oldSelf`: “scope is immutable”",
                "rule `size(self) > 0`: message `'empty: ' + self`"
            ]
        );
    }

    #[test]
    fn cells_keep_code_and_escape_the_rest() {
        assert_eq!(
            cell("a `<root>/x|y` and <b> *c*\n  next\n\nsecond"),
            "a `<root>/x\\|y` and &lt;b> \\*c\\* next<br>second"
        );
        assert_eq!(code("a`b"), "``a`b``");
        assert_eq!(compact(&json!(420.0)), "420");
        assert_eq!(compact(&json!({"a": 1})), "{\"a\":1}");
        assert_eq!(
            slug("Sandbox.spec.env[].valueFrom"),
            "sandboxspecenvvaluefrom"
        );
    }
}
