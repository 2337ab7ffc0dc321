//! Writing crictl's output: stdout that a closed pipe does not fail, stderr, the JSON and YAML
//! documents, the verbose views' label blocks, and the IDs an inspect command works on.

use std::io::Write;

use anyhow::Context;

use super::json::Json;
use super::yaml;

/// Writes `text` to stdout; a closed pipe (`| head`) is not an error.
pub(crate) fn out(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("write to stdout"),
    }
}

/// The IDs an inspect command works on: those given, else those `listed` finds; `None`, after
/// crictl's message, when there are none.
pub(crate) async fn ids_to_inspect(
    given: &[String],
    listed: impl Future<Output = anyhow::Result<Vec<String>>>,
) -> anyhow::Result<Option<Vec<String>>> {
    let ids = if given.is_empty() {
        listed.await?
    } else {
        given.to_vec()
    };
    if ids.is_empty() {
        err_out(b"No IDs provided or nothing found per filter\n");
        return Ok(None);
    }
    Ok(Some(ids))
}

/// Writes bytes to stderr.
pub(crate) fn err_out(bytes: &[u8]) {
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(bytes).and_then(|()| stderr.flush());
}

/// Prints a list output as proto3 JSON or YAML: `{"<key>": [...]}`.
pub(crate) fn print_list(key: &str, items: Vec<Json>, yaml: bool) -> anyhow::Result<()> {
    let doc = Json::Obj(vec![(key.to_string(), Json::Arr(items))]);
    print_doc(&doc, yaml, false)
}

/// Prints a document crictl's way: proto3 JSON (`go == false`) or Go JSON of a sorted map,
/// or YAML of either; each followed by crictl's `Println` newline.
pub(crate) fn print_doc(doc: &Json, yaml: bool, go: bool) -> anyhow::Result<()> {
    let text = if yaml {
        let doc = if go {
            go_numbers(doc.clone())
        } else {
            doc.clone()
        };
        format!("{}\n", yaml::to_yaml(&doc))
    } else if go {
        format!("{}\n", doc.to_gojson())
    } else {
        format!("{}\n", doc.to_protojson())
    };
    out(&text)
}

/// Numbers as Go writes them after reading them into `float64` (the YAML of the status
/// outputs sees the JSON that Go wrote).
fn go_numbers(v: Json) -> Json {
    match v {
        Json::Num(n) => match Json::Num(n.clone()).to_gojson().as_str() {
            "" => Json::Num(n),
            text => Json::Num(text.to_string()),
        },
        Json::Arr(a) => Json::Arr(a.into_iter().map(go_numbers).collect()),
        Json::Obj(m) => Json::Obj(m.into_iter().map(|(k, v)| (k, go_numbers(v))).collect()),
        other => other,
    }
}

/// The `Labels:` / `Annotations:` block of crictl's verbose views: one `\tkey -> value` line
/// per entry, sorted; nothing for an empty map.
pub(crate) fn map_block(title: &str, m: &crate::cri::StringMap) -> String {
    if m.is_empty() {
        return String::new();
    }
    let mut s = format!("{title}:\n");
    for (k, v) in m {
        s.push_str(&format!("\t{k} -> {v}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_blocks_are_sorted_and_absent_when_empty() {
        let mut m = crate::cri::StringMap::new();
        assert_eq!(map_block("Labels", &m), "");
        m.insert("b".into(), "2".into());
        m.insert("a".into(), "1".into());
        assert_eq!(map_block("Labels", &m), "Labels:\n\ta -> 1\n\tb -> 2\n");
    }

    #[test]
    fn go_numbers_reformat_through_float64() {
        let v = go_numbers(Json::Arr(vec![
            Json::Num("22704".into()),
            Json::Num("1e21".into()),
        ]));
        assert_eq!(
            v,
            Json::Arr(vec![Json::Num("22704".into()), Json::Num("1e+21".into())])
        );
    }
}
