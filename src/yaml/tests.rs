use std::collections::BTreeMap;

use serde_json::json;

use super::*;

#[derive(Debug, PartialEq, serde::Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct Named {
    name: String,
    #[serde(default)]
    on: Option<bool>,
    #[serde(default)]
    count: Option<u32>,
    #[serde(default)]
    mode: Option<Mode>,
    #[serde(default)]
    tags: Vec<String>,
}

#[derive(Debug, PartialEq, serde::Deserialize)]
enum Mode {
    Never,
    Always,
}

fn one<T: DeserializeOwned>(text: &str) -> Result<T, YamlError> {
    from_str(text).map(|t| t.expect("a document"))
}

#[test]
fn a_plain_scalar_read_as_text_keeps_its_text_where_a_number_or_boolean_would_not() {
    for text in ["1.10", "true", "0x1F", "1e3", "~"] {
        let named: Named = one(&format!("name: {text}\n")).unwrap();
        assert_eq!(named.name, text);
    }
}

#[test]
fn a_field_typed_as_a_boolean_a_number_or_an_enum_reads_it_from_the_text() {
    let named: Named = one("name: a\non: true\ncount: 7\nmode: Always\ntags: [x, 'y']\n").unwrap();
    assert_eq!(
        named,
        Named {
            name: "a".into(),
            on: Some(true),
            count: Some(7),
            mode: Some(Mode::Always),
            tags: vec!["x".into(), "y".into()],
        }
    );
    let named: Named = one("name: a\non: null\ncount: ~\nmode:\n").unwrap();
    assert_eq!((named.on, named.count, named.mode), (None, None, None));
}

#[test]
fn where_the_type_does_not_say_a_plain_scalar_resolves_by_the_core_schema() {
    let value: serde_json::Value = one(
        "a: 1\nb: -2.5\nc: true\nd: null\ne: '1'\nf: \"true\"\ng: text\nh: 1.10.2\ni: .inf\nj:\n",
    )
    .unwrap();
    assert_eq!(
        value,
        json!({"a": 1, "b": -2.5, "c": true, "d": null, "e": "1", "f": "true", "g": "text",
               "h": "1.10.2", "i": ".inf", "j": null})
    );
    let tagged: serde_json::Value = one("a: !!str 1\n").unwrap();
    assert_eq!(tagged, json!({"a": "1"}));
}

#[test]
fn json_is_read_as_yaml() {
    let value: BTreeMap<String, Vec<u8>> = one(r#"{"a": [1, 2], "b": []}"#).unwrap();
    assert_eq!(value["a"], [1, 2]);
    assert!(value["b"].is_empty());
}

#[test]
fn an_empty_file_or_one_of_comments_has_no_document_and_two_documents_are_listed() {
    assert_eq!(from_str::<Named>("").unwrap(), None);
    assert_eq!(from_str::<Named>("# only this\n").unwrap(), None);
    assert_eq!(documents("a: 1\n---\nb: 2\n").unwrap().len(), 2);
    let err = from_str::<serde_json::Value>("a: 1\n---\nb: 2\n").unwrap_err();
    assert!(err.to_string().contains("more than one document"), "{err}");
}

#[test]
fn an_alias_copies_its_anchors_tree() {
    let value: serde_json::Value = one("base: &b {x: 1, y: [a]}\ncopy: *b\n").unwrap();
    assert_eq!(value["copy"], json!({"x": 1, "y": ["a"]}));
}

#[test]
fn aliases_that_would_expand_past_the_node_bound_are_refused() {
    // ten times ten, seven times over: 10^7 nodes from a few lines
    let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..7 {
        let p = i - 1;
        text.push_str(&format!(
            "a{i}: &a{i} [{}]\n",
            vec![format!("*a{p}"); 10].join(", ")
        ));
    }
    let err = documents(&text).unwrap_err().to_string();
    assert!(
        err.contains(&format!("more than {MAX_NODES} nodes")),
        "{err}"
    );
}

#[test]
fn a_value_of_the_wrong_shape_is_an_error_naming_where_it_is() {
    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Outer {
        users: Vec<BTreeMap<String, Named>>,
    }
    let err = one::<Outer>("users:\n- u: {name: a}\n- u: {name: [x]}\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "users[1].u.name: invalid type: sequence, expected a string"
    );
    let err = one::<Named>("name: a\ncount: many\n").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("count: invalid value: string \"many\""),
        "{err}"
    );
    let err = one::<Named>("name: a\nbogus: 1\n").unwrap_err();
    assert!(
        err.to_string().starts_with("bogus: unknown field `bogus`"),
        "{err}"
    );
}

#[test]
fn text_that_is_not_yaml_is_an_error_naming_its_line() {
    let err = documents("a: 1\nb: [1, 2\n").unwrap_err().to_string();
    assert!(err.contains("line"), "{err}");
    let err = documents("? [a]\n: 1\n").unwrap_err().to_string();
    assert!(err.contains("a mapping key that is not a scalar"), "{err}");
}

#[test]
fn nesting_past_the_parsers_limit_is_an_error_not_a_stack_overflow() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let err = documents(&deep).unwrap_err().to_string();
    assert!(err.contains("recursion limit"), "{err}");
    let fine = format!("{}{}", "[".repeat(100), "]".repeat(100));
    assert_eq!(documents(&fine).unwrap().len(), 1);
}
