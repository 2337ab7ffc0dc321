//! JSON as crictl prints it, in two dialects:
//!
//! - **proto3 JSON** (protojson with `EmitDefaultValues` and a 2-space indent), for the list
//!   outputs (`ps`, `pods`, `images`, `stats`, `events`): fields in proto order, camelCase names,
//!   64-bit integers as strings, enums by name, `<>&` as they are;
//! - **Go `encoding/json`** of a `map[string]any` (crictl's `outputStatusData`), for `inspect*`,
//!   `info` and `imagefsinfo`: every object's keys sorted, numbers through `float64`, `<` `>`
//!   `&` escaped as `\u003c` `\u003e` `\u0026`.
//!
//! [`Json`] keeps object members in the order they were built, so one value serves both.

use crate::gojson::{self, GoValue};

/// A JSON value whose objects keep their members in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// A number, as its text (`137`, `1.5`).
    Num(String),
    /// A string.
    Str(String),
    /// An array.
    Arr(Vec<Json>),
    /// An object, members in order.
    Obj(Vec<(String, Json)>),
}

impl Json {
    /// A string.
    pub fn str(s: impl Into<String>) -> Json {
        Json::Str(s.into())
    }

    /// A 32-bit integer, which proto3 JSON writes as a number.
    pub fn int(v: impl Into<i64>) -> Json {
        Json::Num(v.into().to_string())
    }

    /// A 64-bit integer, which proto3 JSON writes as a string.
    pub fn int64(v: impl ToString) -> Json {
        Json::Str(v.to_string())
    }

    /// A double, written the way Go writes floats.
    pub fn double(v: f64) -> Json {
        if !v.is_finite() {
            // proto3 JSON's spellings of the non-finite doubles
            return Json::str(if v.is_nan() {
                "NaN"
            } else if v > 0.0 {
                "Infinity"
            } else {
                "-Infinity"
            });
        }
        Json::Num(String::from_utf8_lossy(&gojson::marshal(&GoValue::Float(v))).into_owned())
    }

    /// An object from members.
    pub fn obj(members: Vec<(&str, Json)>) -> Json {
        Json::Obj(
            members
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        )
    }

    /// A map of strings as an object (keys sorted, as protojson writes maps).
    pub fn map<'a>(m: impl IntoIterator<Item = (&'a String, &'a String)>) -> Json {
        let mut members: Vec<(String, Json)> = m
            .into_iter()
            .map(|(k, v)| (k.clone(), Json::str(v.clone())))
            .collect();
        members.sort_by(|a, b| a.0.cmp(&b.0));
        Json::Obj(members)
    }

    /// An array of strings.
    pub fn strs<'a>(v: impl IntoIterator<Item = &'a String>) -> Json {
        Json::Arr(v.into_iter().map(|s| Json::str(s.clone())).collect())
    }

    /// The member `key` of an object.
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Sets the member `key` of an object, in place if present, else at the end.
    pub fn set(&mut self, key: &str, value: Json) {
        if let Json::Obj(m) = self {
            match m.iter_mut().find(|(k, _)| k == key) {
                Some((_, v)) => *v = value,
                None => m.push((key.to_string(), value)),
            }
        }
    }

    /// The value with every object's keys sorted by bytes, at every depth (what Go's
    /// `json.Marshal` of a `map[string]any` does).
    pub fn sorted(self) -> Json {
        match self {
            Json::Arr(items) => Json::Arr(items.into_iter().map(Json::sorted).collect()),
            Json::Obj(members) => {
                let mut members: Vec<(String, Json)> =
                    members.into_iter().map(|(k, v)| (k, v.sorted())).collect();
                members.sort_by(|a, b| a.0.cmp(&b.0));
                Json::Obj(members)
            }
            other => other,
        }
    }

    /// A parsed JSON document (numbers keep their text).
    pub fn from_serde(v: serde_json::Value) -> Json {
        match v {
            serde_json::Value::Null => Json::Null,
            serde_json::Value::Bool(b) => Json::Bool(b),
            serde_json::Value::Number(n) => Json::Num(n.to_string()),
            serde_json::Value::String(s) => Json::Str(s),
            serde_json::Value::Array(a) => Json::Arr(a.into_iter().map(Json::from_serde).collect()),
            serde_json::Value::Object(o) => Json::Obj(
                o.into_iter()
                    .map(|(k, v)| (k, Json::from_serde(v)))
                    .collect(),
            ),
        }
    }

    /// proto3 JSON text, indented by two spaces, no newline at the end.
    pub fn to_protojson(&self) -> String {
        let mut out = String::new();
        write(&mut out, self, 0, Dialect::ProtoJson);
        out
    }

    /// Go `encoding/json` text of the value after [`Json::sorted`], indented by two spaces
    /// (`json.Indent`), no newline at the end.
    pub fn to_gojson(&self) -> String {
        let mut out = String::new();
        write(&mut out, &self.clone().sorted(), 0, Dialect::Go);
        out
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dialect {
    ProtoJson,
    Go,
}

fn indent(out: &mut String, depth: usize) {
    out.push('\n');
    out.extend(std::iter::repeat_n(' ', depth * 2));
}

fn write(out: &mut String, v: &Json, depth: usize, dialect: Dialect) {
    match v {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Num(n) => match dialect {
            Dialect::ProtoJson => out.push_str(n),
            // Go decodes every number into a float64 and writes that back
            Dialect::Go => match n.parse::<f64>() {
                Ok(f) => out.push_str(&String::from_utf8_lossy(&gojson::marshal(&GoValue::Float(
                    f,
                )))),
                Err(_) => out.push_str(n),
            },
        },
        Json::Str(s) => match dialect {
            Dialect::ProtoJson => write_protojson_string(out, s),
            Dialect::Go => {
                let mut buf = Vec::new();
                gojson::write_string(&mut buf, s.as_bytes(), gojson::Dialect::Go122);
                out.push_str(&String::from_utf8_lossy(&buf));
            }
        },
        Json::Arr(items) => {
            if items.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                indent(out, depth + 1);
                write(out, item, depth + 1, dialect);
            }
            indent(out, depth);
            out.push(']');
        }
        Json::Obj(members) => {
            if members.is_empty() {
                out.push_str("{}");
                return;
            }
            out.push('{');
            for (i, (k, item)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                indent(out, depth + 1);
                write(out, &Json::Str(k.clone()), depth + 1, dialect);
                out.push_str(": ");
                write(out, item, depth + 1, dialect);
            }
            indent(out, depth);
            out.push('}');
        }
    }
}

/// protojson's string escaping: `"` `\` and control characters only (`\b \f \n \r \t`, else
/// `\u00xx` in lowercase hex); `<>&` and non-ASCII stay as they are.
fn write_protojson_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// One entry of a runtime's verbose `info` map as crictl shows it: a value starting with `{`
/// is a JSON object; anything else is a string with its surrounding quotes removed.
pub fn info_value(raw: &str) -> Json {
    if raw.starts_with('{')
        && let Ok(v) = serde_json::from_str::<serde_json::Value>(raw)
    {
        return Json::from_serde(v);
    }
    Json::str(raw.trim_matches('"'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Json {
        Json::obj(vec![
            ("id", Json::str("a<b>&c")),
            ("createdAt", Json::int64(1_796_058_714_959_500_685_i64)),
            ("attempt", Json::int(2)),
            ("labels", Json::Obj(vec![])),
            ("tags", Json::Arr(vec![])),
            (
                "meta",
                Json::obj(vec![("z", Json::Bool(true)), ("a", Json::Null)]),
            ),
        ])
    }

    #[test]
    fn protojson_keeps_member_order_and_leaves_html_characters_alone() {
        assert_eq!(
            sample().to_protojson(),
            "{\n  \"id\": \"a<b>&c\",\n  \"createdAt\": \"1796058714959500685\",\n  \
             \"attempt\": 2,\n  \"labels\": {},\n  \"tags\": [],\n  \"meta\": {\n    \
             \"z\": true,\n    \"a\": null\n  }\n}"
        );
    }

    #[test]
    fn go_json_sorts_keys_escapes_html_and_reads_numbers_as_floats() {
        let mut v = sample();
        v.set("big", Json::Num("12345678901234567890123".into()));
        assert_eq!(
            v.to_gojson(),
            "{\n  \"attempt\": 2,\n  \"big\": 1.2345678901234568e+22,\n  \
             \"createdAt\": \"1796058714959500685\",\n  \"id\": \"a\\u003cb\\u003e\\u0026c\",\n  \
             \"labels\": {},\n  \"meta\": {\n    \"a\": null,\n    \"z\": true\n  },\n  \
             \"tags\": []\n}"
        );
    }

    #[test]
    fn control_characters_are_escaped_in_both_dialects() {
        let v = Json::str("a\"\\\n\u{1b}é");
        assert_eq!(v.to_protojson(), "\"a\\\"\\\\\\n\\u001bé\"");
        assert_eq!(v.to_gojson(), "\"a\\\"\\\\\\n\\u001bé\"");
    }

    #[test]
    fn info_values_are_objects_or_unquoted_strings() {
        assert_eq!(
            info_value("{\"pid\": 22704}"),
            Json::obj(vec![("pid", Json::Num("22704".into()))])
        );
        assert_eq!(info_value("\"go1.19.8\""), Json::str("go1.19.8"));
        assert_eq!(info_value("{not json"), Json::str("{not json"));
    }

    #[test]
    fn doubles_are_written_the_go_way() {
        assert_eq!(Json::double(0.0), Json::Num("0".into()));
        assert_eq!(Json::double(1.5), Json::Num("1.5".into()));
        assert_eq!(Json::double(1e21), Json::Num("1e+21".into()));
        assert_eq!(Json::double(f64::NAN), Json::str("NaN"));
    }
}
