//! A Go `encoding/json` (`json.Marshal`) compatible encoder for the values kruise and kubelet hash,
//! the annotations kruise reads back byte for byte, and `kruised crictl`'s JSON.
//!
//! Go's output differs from serde_json's in ways that change hashes: struct fields come out in
//! declaration order (not sorted), map keys are sorted by byte order, `<` `>` `&` are written as
//! `\u003c` `\u003e` `\u0026`, U+2028/U+2029 as `\u2028`/`\u2029`, and bytes that are not valid UTF-8 as
//! `\ufffd` (one per offending byte). [`GoValue`] keeps the distinction between a struct (ordered
//! fields) and a map (sorted keys); [`GoStruct`] applies Go's `omitempty` rules while building one.
//!
//! Reference: `encoding/json/encode.go` (`appendString`, `isEmptyValue`, `mapEncoder`, `floatEncoder`)
//! of Go 1.22+.

use std::collections::BTreeMap;

/// Which Go release's string escaping to reproduce.
///
/// Go 1.22 started writing U+0008 and U+000C as `\b` and `\f`; earlier releases wrote `\u0008` and
/// `\u000c`. Everything else is identical. kruise-manager ≤ 1.7 and kubelet ≤ 1.29 were built with Go
/// < 1.22; kruise ≥ 1.8 and kubelet ≥ 1.30 with Go ≥ 1.22.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// Go 1.22 and later (`\b`, `\f`).
    #[default]
    Go122,
    /// Go 1.21 and earlier (`\u0008`, `\u000c`).
    PreGo122,
}

/// A value as Go's encoder sees it.
#[derive(Clone, Debug, PartialEq)]
pub enum GoValue {
    /// `null`: a nil pointer, nil slice, nil map or nil interface.
    Null,
    /// A Go `bool`.
    Bool(bool),
    /// A signed Go integer (`int`, `int32`, `int64`, …).
    Int(i64),
    /// An unsigned Go integer (`uint8` … `uint64`).
    Uint(u64),
    /// A Go `float64`. Non-finite values (which Go refuses to encode) are written as `null`.
    Float(f64),
    /// A Go `string` holding valid UTF-8.
    String(String),
    /// A Go `string` holding arbitrary bytes; invalid UTF-8 is written as `\ufffd` per bad byte.
    /// (This is not a Go `[]byte`, which Go would base64-encode.)
    ByteString(Vec<u8>),
    /// A non-nil Go slice or array.
    Array(Vec<GoValue>),
    /// A Go struct: fields in declaration order, already filtered by `omitempty`
    /// (see [`GoStruct`]); embedded (`json:",inline"`) structs are flattened by the caller.
    Struct(Vec<(String, GoValue)>),
    /// A non-nil Go `map[string]T`: keys are emitted sorted by byte order, as Go does.
    Map(BTreeMap<String, GoValue>),
}

impl GoValue {
    /// Go's `isEmptyValue`, the test `omitempty` applies: `false`, `0`, `""`, nil, and empty
    /// slices/maps are empty; structs never are.
    pub fn is_go_empty(&self) -> bool {
        match self {
            GoValue::Null => true,
            GoValue::Bool(b) => !*b,
            GoValue::Int(i) => *i == 0,
            GoValue::Uint(u) => *u == 0,
            GoValue::Float(f) => *f == 0.0,
            GoValue::String(s) => s.is_empty(),
            GoValue::ByteString(s) => s.is_empty(),
            GoValue::Array(a) => a.is_empty(),
            GoValue::Map(m) => m.is_empty(),
            GoValue::Struct(_) => false,
        }
    }

    /// Encodes with Go ≥ 1.22 rules; same as [`marshal`].
    pub fn to_go_json(&self) -> Vec<u8> {
        marshal(self)
    }
}

impl From<&str> for GoValue {
    fn from(s: &str) -> Self {
        GoValue::String(s.to_owned())
    }
}

impl From<String> for GoValue {
    fn from(s: String) -> Self {
        GoValue::String(s)
    }
}

impl From<bool> for GoValue {
    fn from(b: bool) -> Self {
        GoValue::Bool(b)
    }
}

impl From<i32> for GoValue {
    fn from(i: i32) -> Self {
        GoValue::Int(i64::from(i))
    }
}

impl From<i64> for GoValue {
    fn from(i: i64) -> Self {
        GoValue::Int(i)
    }
}

/// Converts a serde_json tree the way Go would encode the equivalent `interface{}` value: objects
/// become maps (sorted keys), integers stay integers, other numbers are `float64`.
impl From<&serde_json::Value> for GoValue {
    fn from(v: &serde_json::Value) -> Self {
        match v {
            serde_json::Value::Null => GoValue::Null,
            serde_json::Value::Bool(b) => GoValue::Bool(*b),
            serde_json::Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    GoValue::Int(i)
                } else if let Some(u) = n.as_u64() {
                    GoValue::Uint(u)
                } else {
                    GoValue::Float(n.as_f64().unwrap_or(f64::NAN))
                }
            }
            serde_json::Value::String(s) => GoValue::String(s.clone()),
            serde_json::Value::Array(a) => GoValue::Array(a.iter().map(GoValue::from).collect()),
            serde_json::Value::Object(o) => GoValue::Map(
                o.iter()
                    .map(|(k, v)| (k.clone(), GoValue::from(v)))
                    .collect(),
            ),
        }
    }
}

/// Builder for [`GoValue::Struct`] that applies Go's field-tag semantics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GoStruct {
    fields: Vec<(String, GoValue)>,
}

impl GoStruct {
    /// An empty struct (`{}`).
    pub fn new() -> Self {
        Self::default()
    }

    /// A field without `omitempty`: always emitted.
    pub fn field(mut self, name: &str, value: impl Into<GoValue>) -> Self {
        self.fields.push((name.to_owned(), value.into()));
        self
    }

    /// A non-pointer field tagged `omitempty`. `None` stands for the Go zero value; the field is
    /// dropped when `None` or when the value is Go-empty ([`GoValue::is_go_empty`]).
    pub fn omitempty(mut self, name: &str, value: Option<GoValue>) -> Self {
        if let Some(v) = value
            && !v.is_go_empty()
        {
            self.fields.push((name.to_owned(), v));
        }
        self
    }

    /// A pointer field tagged `omitempty`: dropped only when nil (`None`); a pointer to a zero value
    /// (`false`, `0`, `""`) is emitted.
    pub fn ptr_omitempty(mut self, name: &str, value: Option<GoValue>) -> Self {
        if let Some(v) = value {
            self.fields.push((name.to_owned(), v));
        }
        self
    }

    /// A pointer field without `omitempty`: `null` when nil.
    pub fn ptr(mut self, name: &str, value: Option<GoValue>) -> Self {
        self.fields
            .push((name.to_owned(), value.unwrap_or(GoValue::Null)));
        self
    }

    /// Appends the fields of an embedded (`json:",inline"`) struct.
    pub fn inline(mut self, embedded: GoStruct) -> Self {
        self.fields.extend(embedded.fields);
        self
    }

    /// The finished struct value.
    pub fn build(self) -> GoValue {
        GoValue::Struct(self.fields)
    }
}

impl From<GoStruct> for GoValue {
    fn from(s: GoStruct) -> Self {
        s.build()
    }
}

/// `json.Marshal(v)` with Go ≥ 1.22 rules.
pub fn marshal(v: &GoValue) -> Vec<u8> {
    marshal_with(v, Dialect::Go122)
}

/// `json.Marshal(v)` with the given Go release's escaping rules.
pub fn marshal_with(v: &GoValue, dialect: Dialect) -> Vec<u8> {
    let mut out = Vec::new();
    write_value(&mut out, v, dialect);
    out
}

/// Appends the Go JSON encoding of `v` to `out`.
pub fn write_value(out: &mut Vec<u8>, v: &GoValue, dialect: Dialect) {
    match v {
        GoValue::Null => out.extend_from_slice(b"null"),
        GoValue::Bool(true) => out.extend_from_slice(b"true"),
        GoValue::Bool(false) => out.extend_from_slice(b"false"),
        GoValue::Int(i) => out.extend_from_slice(i.to_string().as_bytes()),
        GoValue::Uint(u) => out.extend_from_slice(u.to_string().as_bytes()),
        GoValue::Float(f) => write_float(out, *f),
        GoValue::String(s) => write_string(out, s.as_bytes(), dialect),
        GoValue::ByteString(s) => write_string(out, s, dialect),
        GoValue::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(out, item, dialect);
            }
            out.push(b']');
        }
        GoValue::Struct(fields) => {
            write_members(out, fields.iter().map(|(k, v)| (k.as_str(), v)), dialect);
        }
        GoValue::Map(map) => {
            write_members(out, map.iter().map(|(k, v)| (k.as_str(), v)), dialect);
        }
    }
}

/// Writes `{"k":v,…}` in the order given.
fn write_members<'a>(
    out: &mut Vec<u8>,
    members: impl Iterator<Item = (&'a str, &'a GoValue)>,
    dialect: Dialect,
) {
    out.push(b'{');
    for (i, (k, v)) in members.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_string(out, k.as_bytes(), dialect);
        out.push(b':');
        write_value(out, v, dialect);
    }
    out.push(b'}');
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Whether Go writes this ASCII byte literally with HTML escaping on (`htmlSafeSet`).
fn html_safe(b: u8) -> bool {
    b >= 0x20 && !matches!(b, b'"' | b'\\' | b'<' | b'>' | b'&')
}

/// Appends `s` as a Go JSON string (Go's `appendString` with `escapeHTML = true`), quotes included.
///
/// `s` may hold any bytes: each byte that does not start a valid UTF-8 sequence becomes `\ufffd`.
pub fn write_string(out: &mut Vec<u8>, s: &[u8], dialect: Dialect) {
    out.push(b'"');
    let mut start = 0;
    let mut i = 0;
    while i < s.len() {
        let b = s[i];
        if b < 0x80 {
            if html_safe(b) {
                i += 1;
                continue;
            }
            out.extend_from_slice(&s[start..i]);
            match b {
                b'\\' | b'"' => out.extend_from_slice(&[b'\\', b]),
                0x08 if dialect == Dialect::Go122 => out.extend_from_slice(b"\\b"),
                0x0c if dialect == Dialect::Go122 => out.extend_from_slice(b"\\f"),
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b'\t' => out.extend_from_slice(b"\\t"),
                _ => out.extend_from_slice(&[
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[usize::from(b >> 4)],
                    HEX[usize::from(b & 0xf)],
                ]),
            }
            i += 1;
            start = i;
            continue;
        }
        match decode_rune(&s[i..]) {
            None => {
                out.extend_from_slice(&s[start..i]);
                out.extend_from_slice(b"\\ufffd");
                i += 1;
                start = i;
            }
            Some(c @ ('\u{2028}' | '\u{2029}')) => {
                out.extend_from_slice(&s[start..i]);
                out.extend_from_slice(b"\\u202");
                out.push(HEX[(u32::from(c) & 0xf) as usize]);
                i += c.len_utf8();
                start = i;
            }
            Some(c) => i += c.len_utf8(),
        }
    }
    out.extend_from_slice(&s[start..]);
    out.push(b'"');
}

/// Decodes the first UTF-8 scalar of `s` (`utf8.DecodeRune`); `None` where Go returns
/// `(RuneError, 1)`.
fn decode_rune(s: &[u8]) -> Option<char> {
    let head = &s[..s.len().min(4)];
    let valid = match std::str::from_utf8(head) {
        Ok(v) => v,
        Err(e) => std::str::from_utf8(&head[..e.valid_up_to()]).unwrap_or_default(),
    };
    valid.chars().next()
}

/// Go's `floatEncoder` for `float64`: shortest round-trip digits, `%f` style for magnitudes in
/// `[1e-6, 1e21)` and `%e` style (`1e+21`, `1e-7`) outside it.
fn write_float(out: &mut Vec<u8>, f: f64) {
    if !f.is_finite() {
        out.extend_from_slice(b"null");
        return;
    }
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        let text = format!("{f:e}");
        let (mantissa, exponent) = text.split_once('e').unwrap_or((text.as_str(), "0"));
        out.extend_from_slice(mantissa.as_bytes());
        out.push(b'e');
        if !exponent.starts_with('-') {
            out.push(b'+');
        }
        out.extend_from_slice(exponent.as_bytes());
    } else {
        out.extend_from_slice(format!("{f}").as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn go(v: &GoValue) -> String {
        String::from_utf8(marshal(v)).unwrap()
    }

    fn go_str(s: &str) -> String {
        go(&GoValue::from(s))
    }

    fn go_bytes(b: &[u8]) -> String {
        go(&GoValue::ByteString(b.to_vec()))
    }

    #[test]
    fn html_characters_are_escaped_like_go() {
        assert_eq!(go_str("<a&b>"), r#""\u003ca\u0026b\u003e""#);
    }

    #[test]
    fn quotes_and_backslashes_are_escaped_with_a_backslash() {
        assert_eq!(go_str(r#"a"b\c"#), r#""a\"b\\c""#);
    }

    #[test]
    fn common_control_characters_use_short_escapes() {
        assert_eq!(go_str("\n\r\t"), r#""\n\r\t""#);
        assert_eq!(go_str("\u{8}\u{c}"), r#""\b\f""#);
    }

    #[test]
    fn go_before_1_22_writes_backspace_and_form_feed_as_unicode_escapes() {
        let v = GoValue::from("\u{8}\u{c}\n");
        assert_eq!(
            marshal_with(&v, Dialect::PreGo122),
            br#""\u0008\u000c\n""#.to_vec()
        );
    }

    #[test]
    fn other_control_characters_use_lowercase_unicode_escapes() {
        assert_eq!(
            go_str("\u{0}\u{1}\u{b}\u{1f}"),
            r#""\u0000\u0001\u000b\u001f""#
        );
    }

    #[test]
    fn delete_character_is_written_literally() {
        assert_eq!(go_str("\u{7f}"), "\"\u{7f}\"");
    }

    #[test]
    fn line_and_paragraph_separators_are_escaped() {
        assert_eq!(go_str("a\u{2028}b\u{2029}c"), r#""a\u2028b\u2029c""#);
    }

    #[test]
    fn non_ascii_text_is_written_as_literal_utf8() {
        assert_eq!(
            go_str("héllo 世界 🦀 \u{fffd}"),
            "\"héllo 世界 🦀 \u{fffd}\""
        );
    }

    #[test]
    fn each_invalid_utf8_byte_becomes_an_escaped_replacement_character() {
        assert_eq!(go_bytes(b"a\xffb"), r#""a\ufffdb""#);
        // Truncated 3-byte sequence: Go's DecodeRune rejects byte by byte.
        assert_eq!(go_bytes(b"\xe2\x82A"), r#""\ufffd\ufffdA""#);
        // Encoded surrogate (invalid in UTF-8).
        assert_eq!(go_bytes(b"\xed\xa0\x80"), r#""\ufffd\ufffd\ufffd""#);
        // Truncated at the very end.
        assert_eq!(go_bytes(b"x\xf0\x9f\xa6"), r#""x\ufffd\ufffd\ufffd""#);
        // Valid multi-byte text around an invalid byte is kept.
        assert_eq!(go_bytes("é\u{80}".as_bytes()), "\"é\u{80}\"");
        assert_eq!(go_bytes(b"\xc3\xa9\x80"), "\"é\\ufffd\"");
    }

    #[test]
    fn integers_are_printed_plainly() {
        assert_eq!(go(&GoValue::Int(-42)), "-42");
        assert_eq!(go(&GoValue::Int(i64::MIN)), "-9223372036854775808");
        assert_eq!(go(&GoValue::Uint(u64::MAX)), "18446744073709551615");
    }

    #[test]
    fn floats_follow_go_formatting() {
        assert_eq!(go(&GoValue::Float(1.0)), "1");
        assert_eq!(go(&GoValue::Float(0.5)), "0.5");
        assert_eq!(go(&GoValue::Float(-0.0)), "-0");
        assert_eq!(go(&GoValue::Float(1e20)), "100000000000000000000");
        assert_eq!(go(&GoValue::Float(1e21)), "1e+21");
        assert_eq!(go(&GoValue::Float(1.5e300)), "1.5e+300");
        assert_eq!(go(&GoValue::Float(0.000001)), "0.000001");
        assert_eq!(go(&GoValue::Float(1e-7)), "1e-7");
        assert_eq!(go(&GoValue::Float(1.25e-10)), "1.25e-10");
        assert_eq!(go(&GoValue::Float(f64::NAN)), "null");
    }

    #[test]
    fn struct_fields_keep_declaration_order_and_maps_sort_keys() {
        let map: BTreeMap<String, GoValue> = [("b", 1), ("a", 2), ("B", 3)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), GoValue::from(v)))
            .collect();
        let v = GoStruct::new()
            .field("z", "first")
            .field("a", GoValue::Map(map))
            .build();
        assert_eq!(go(&v), r#"{"z":"first","a":{"B":3,"a":2,"b":1}}"#);
    }

    #[test]
    fn omitempty_drops_go_zero_values_but_pointers_keep_them() {
        let v = GoStruct::new()
            .omitempty("s", Some(GoValue::from("")))
            .omitempty("i", Some(GoValue::Int(0)))
            .omitempty("b", Some(GoValue::Bool(false)))
            .omitempty("a", Some(GoValue::Array(vec![])))
            .omitempty("m", Some(GoValue::Map(BTreeMap::new())))
            .omitempty("n", None)
            .omitempty("st", Some(GoStruct::new().build()))
            .ptr_omitempty("pb", Some(GoValue::Bool(false)))
            .ptr_omitempty("ps", Some(GoValue::from("")))
            .ptr_omitempty("pn", None)
            .ptr("np", None)
            .build();
        assert_eq!(go(&v), r#"{"st":{},"pb":false,"ps":"","np":null}"#);
    }

    #[test]
    fn keys_and_field_names_are_escaped_too() {
        let map: BTreeMap<String, GoValue> = [("<k>".to_owned(), GoValue::Null)].into();
        assert_eq!(go(&GoValue::Map(map)), r#"{"\u003ck\u003e":null}"#);
    }

    #[test]
    fn serde_json_values_convert_to_sorted_maps() {
        let v: serde_json::Value = serde_json::json!({"b": [1, -2, true, null, "x&y"], "a": {}});
        assert_eq!(
            go(&GoValue::from(&v)),
            r#"{"a":{},"b":[1,-2,true,null,"x\u0026y"]}"#
        );
    }

    /// Characters where Go ≥ 1.22 and serde_json disagree: Go's HTML escapes and U+2028/2029.
    /// (Both write `\"` `\\` `\b` `\f` `\n` `\r` `\t`, other C0 controls as lowercase `\u00xx`,
    /// and everything else — DEL included — literally.)
    fn serde_agrees_on(c: char) -> bool {
        !matches!(c, '<' | '>' | '&' | '\u{2028}' | '\u{2029}')
    }

    fn agreeing_string() -> impl Strategy<Value = String> {
        prop_oneof![
            // Bias towards the interesting ASCII range (controls, quotes, backslash).
            proptest::collection::vec(0u8..0x80, 0..16)
                .prop_map(|b| b.into_iter().map(char::from).collect::<String>()),
            any::<String>(),
        ]
        .prop_map(|s| s.chars().filter(|&c| serde_agrees_on(c)).collect())
    }

    fn agreeing_value() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            agreeing_string().prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map(agreeing_string(), inner, 0..6).prop_map(|m| {
                    // Insert in sorted order so the result is sorted whether or not serde_json's
                    // preserve_order feature is on.
                    let mut obj = serde_json::Map::new();
                    for (k, v) in m {
                        obj.insert(k, v);
                    }
                    Value::Object(obj)
                }),
            ]
        })
    }

    proptest! {
        #[test]
        fn output_equals_serde_json_where_the_two_encoders_agree(v in agreeing_value()) {
            prop_assert_eq!(marshal(&GoValue::from(&v)), serde_json::to_vec(&v).unwrap());
        }

        #[test]
        fn decoding_our_output_gives_back_the_input_string(s in any::<String>()) {
            let encoded = marshal(&GoValue::String(s.clone()));
            let decoded: String = serde_json::from_slice(&encoded).unwrap();
            prop_assert_eq!(decoded, s);
        }

        #[test]
        fn decoding_output_of_arbitrary_bytes_gives_valid_text_with_replacements(b in proptest::collection::vec(any::<u8>(), 0..32)) {
            let encoded = marshal(&GoValue::ByteString(b.clone()));
            let decoded: String = serde_json::from_slice(&encoded).unwrap();
            // Go replaces every byte that does not start a valid sequence with one U+FFFD.
            let mut expected = String::new();
            for chunk in b.utf8_chunks() {
                expected.push_str(chunk.valid());
                for _ in chunk.invalid() {
                    expected.push('\u{fffd}');
                }
            }
            prop_assert_eq!(decoded, expected);
        }

        #[test]
        fn output_is_pure_ascii_except_for_literal_non_ascii_text(s in any::<String>()) {
            let encoded = marshal(&GoValue::String(s));
            for forbidden in [b'<', b'>', b'&'] {
                prop_assert!(!encoded.contains(&forbidden));
            }
            prop_assert!(encoded.iter().all(|&b| b >= 0x20));
        }
    }
}
