//! LIST responses (paged with `limit`/`continue` over consistent snapshots)
//! and DELETE on collections.
//!
//! A continue token is `{snapshot id}-{rv}-{position}`; the snapshot is the
//! sorted set of objects at the RV of the first page, so later pages never see
//! writes made after it, like etcd's MVCC reads. Tokens older than the
//! compaction point answer `410 Expired`.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::kinds::{KindInfo, from_storage};
use crate::ops::{self, Preconditions, meta_str, non_empty};
use crate::selectors::Selectors;
use crate::status::ApiError;
use crate::store::State;

fn parse_continue(token: &str) -> Option<(u64, u64, usize)> {
    let mut parts = token.split('-');
    let id = parts.next()?.parse().ok()?;
    let rv = parts.next()?.parse().ok()?;
    let pos = parts.next()?.parse().ok()?;
    parts.next().is_none().then_some((id, rv, pos))
}

/// A LIST response, paged with `limit`/`continue` over a consistent snapshot.
pub(crate) fn list(
    st: &mut State,
    kidx: usize,
    ns: Option<&str>,
    sel: &Selectors,
    limit: Option<usize>,
    cont: Option<&str>,
) -> Result<Value, ApiError> {
    let kinds = st.kinds.clone();
    let (kind, sidx, _) = kinds.with_storage(kidx);
    let (items, rv, id, start) = match non_empty(cont) {
        Some(token) => {
            let (id, rv, pos) = parse_continue(token).ok_or_else(|| {
                ApiError::bad_request(format!("continue key is not valid: {token}"))
            })?;
            let snap = st.find_snapshot(id).filter(|s| s.rv == rv && rv > st.compacted).ok_or_else(|| {
                ApiError::expired("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue value from the response to get the next page.")
            })?;
            (snap.items, rv, Some(id), pos)
        }
        None => (
            Arc::new(st.objects(sidx).cloned().collect::<Vec<_>>()),
            st.rv,
            None,
            0,
        ),
    };
    let limit = limit.filter(|l| *l > 0);
    let mut out = Vec::new();
    let mut next_pos = None;
    let mut remaining = 0usize;
    for (pos, obj) in items.iter().enumerate().skip(start) {
        if ns.is_some_and(|ns| meta_str(obj, "namespace").unwrap_or("") != ns) {
            continue;
        }
        let served = from_storage(kind, obj);
        if !sel.matches(kind, &served) {
            continue;
        }
        if limit.is_some_and(|l| out.len() >= l) {
            next_pos.get_or_insert(pos);
            remaining += 1;
        } else {
            out.push(served);
        }
    }
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let Some(pos) = next_pos {
        let id = match id {
            Some(id) => id,
            None => st.save_snapshot(rv, items.clone()),
        };
        metadata["continue"] = json!(format!("{id}-{rv}-{pos}"));
        if sel.is_empty() {
            metadata["remainingItemCount"] = json!(remaining);
        }
    }
    Ok(list_of(kind, metadata, out))
}

fn list_of(kind: &KindInfo, metadata: Value, items: Vec<Value>) -> Value {
    let (kind_list, api_version) = (format!("{}List", kind.kind), kind.api_version());
    json!({"kind": kind_list, "apiVersion": api_version, "metadata": metadata, "items": items})
}

/// DELETE on a collection: delete every matching object, return them as a list.
pub(crate) fn delete_collection(
    st: &mut State,
    kind: &KindInfo,
    kidx: usize,
    ns: Option<&str>,
    sel: &Selectors,
    dry_run: bool,
) -> Result<Value, ApiError> {
    let listed = list(st, kidx, ns, sel, None, None)?;
    let mut items = Vec::new();
    for item in listed["items"].as_array().into_iter().flatten() {
        let (name, item_ns) = (
            meta_str(item, "name").unwrap_or(""),
            meta_str(item, "namespace"),
        );
        let (v, _) = ops::delete(st, kidx, item_ns, name, &Preconditions::default(), dry_run)?;
        items.push(v);
    }
    Ok(list_of(
        kind,
        json!({"resourceVersion": st.rv.to_string()}),
        items,
    ))
}
