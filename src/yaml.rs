//! The YAML reader of the two files kruised reads as YAML: crictl.yaml (`config::runtime`) and
//! the kubeconfig (`k8s::client`).
//!
//! A file is parsed into a small tree ([`Node`]), and a type is read from the tree by serde
//! through [`from_node`]. Serde readers are generic: a YAML deserialiser that reads straight
//! into a type is compiled again for every type it reads, and the kubeconfig alone has about
//! thirty (issue 44: 0.6 MB of the shipped binary were serde_saphyr's copies of them). The tree's
//! deserialiser is a few lines per type.
//!
//! What a scalar is follows from the type asked for, as Go's `sigs.k8s.io/yaml` does for the
//! kubeconfig: a plain `1.10` read as a `String` is `"1.10"`, not the number 1.1, and `true` read
//! as a `String` is `"true"`. Only where the type does not say (a `serde_json::Value`, such as
//! the kubeconfig's extensions) does a plain scalar resolve by YAML 1.2's core schema: `null`,
//! `~` or nothing is null, `true`/`false` a boolean, a decimal an integer or a float, anything
//! else (and every quoted or block scalar) a string.
//!
//! Anchors and aliases are read; an alias copies its anchor's tree, and a file whose aliases
//! would make more than [`MAX_NODES`] nodes is refused (a "billion laughs").

use std::collections::HashMap;
use std::fmt;

use granit_parser::{Event, Parser, ScalarStyle, Span};
use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, Visitor};

/// The most nodes one file may make, its aliases expanded: far past any kubeconfig.
pub const MAX_NODES: usize = 1_000_000;

/// A YAML node: a scalar, a sequence or a mapping (its keys as text, in the file's order).
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// A scalar's text; `plain` when written without quotes or block indicator and without a
    /// tag (only such a scalar may be read as null, a boolean or a number by inference).
    Scalar {
        /// The text, escapes resolved.
        text: String,
        /// Written plain.
        plain: bool,
    },
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping.
    Map(Vec<(String, Node)>),
}

/// A file that is not YAML, or does not have the shape of the type read from it: where
/// (`users[0].user.token`, or a line and column) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct YamlError {
    path: String,
    message: String,
}

impl YamlError {
    /// The error, found in the value of `key` (a mapping's key, or `[i]`).
    fn under(mut self, key: &str) -> YamlError {
        self.path = match self.path.as_str() {
            "" => key.to_owned(),
            p if p.starts_with('[') => format!("{key}{p}"),
            p => format!("{key}.{p}"),
        };
        self
    }
}

impl fmt::Display for YamlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for YamlError {}

impl de::Error for YamlError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        YamlError {
            path: String::new(),
            message: msg.to_string(),
        }
    }
}

fn at(span: &Span, what: impl fmt::Display) -> YamlError {
    de::Error::custom(format_args!(
        "line {} column {}: {what}",
        span.start.line(),
        span.start.col() + 1
    ))
}

/// The documents of `text`, in order (none for an empty file or one of comments only).
pub fn documents(text: &str) -> Result<Vec<Node>, YamlError> {
    let mut builder = Builder::default();
    for event in Parser::new_from_str(text) {
        let (event, span) = event.map_err(de::Error::custom)?;
        builder.event(event, &span)?;
    }
    Ok(builder.documents)
}

/// A `T` read from the one document of `text`; `None` when it has none (empty, or comments
/// only), an error when it has more than one.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<Option<T>, YamlError> {
    let mut docs = documents(text)?.into_iter();
    let first = docs.next();
    if docs.next().is_some() {
        return Err(de::Error::custom("more than one document (`---`)"));
    }
    first.map(from_node).transpose()
}

/// A `T` read from `node`.
pub fn from_node<T: DeserializeOwned>(node: Node) -> Result<T, YamlError> {
    T::deserialize(node)
}

/// Builds the trees from the parser's events.
#[derive(Default)]
struct Builder {
    documents: Vec<Node>,
    /// Open sequences and mappings; a mapping's pending key as its second member.
    open: Vec<(Node, Option<String>, usize)>,
    anchors: HashMap<usize, Node>,
    nodes: usize,
}

impl Builder {
    fn event(&mut self, event: Event<'_>, span: &Span) -> Result<(), YamlError> {
        match event {
            Event::Scalar(text, style, anchor, tag) => {
                let plain = style == ScalarStyle::Plain && tag.is_none();
                let node = Node::Scalar {
                    text: text.into_owned(),
                    plain,
                };
                self.add(node, anchor, span)
            }
            // nesting is bounded by the parser (its recursion limit), so reading and dropping
            // the tree recursively cannot overflow the stack
            Event::SequenceStart(_, anchor, _) => {
                self.open.push((Node::Seq(Vec::new()), None, anchor));
                Ok(())
            }
            Event::MappingStart(_, anchor, _) => {
                self.open.push((Node::Map(Vec::new()), None, anchor));
                Ok(())
            }
            Event::SequenceEnd | Event::MappingEnd => match self.open.pop() {
                Some((_, Some(key), _)) => Err(at(span, format!("the key {key:?} has no value"))),
                Some((node, None, anchor)) => self.add(node, anchor, span),
                None => Err(at(span, "a collection ends that never began")),
            },
            Event::Alias(id) => {
                let node = self
                    .anchors
                    .get(&id)
                    .cloned()
                    .ok_or_else(|| at(span, "an alias to an unknown anchor"))?;
                self.nodes = self.nodes.saturating_add(count(&node));
                self.add(node, 0, span)
            }
            _ => Ok(()),
        }
    }

    /// Adds a finished node to the collection open around it, or as a document.
    fn add(&mut self, node: Node, anchor: usize, span: &Span) -> Result<(), YamlError> {
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            return Err(at(
                span,
                format!("more than {MAX_NODES} nodes (aliases expanded)"),
            ));
        }
        if anchor != 0 {
            self.anchors.insert(anchor, node.clone());
        }
        match self.open.last_mut() {
            None => self.documents.push(node),
            Some((Node::Seq(items), _, _)) => items.push(node),
            Some((Node::Map(entries), key, _)) => match key.take() {
                Some(k) => entries.push((k, node)),
                None => match node {
                    Node::Scalar { text, .. } => *key = Some(text),
                    _ => return Err(at(span, "a mapping key that is not a scalar")),
                },
            },
            Some((Node::Scalar { .. }, _, _)) => return Err(at(span, "a scalar holds a node")),
        }
        Ok(())
    }
}

/// The nodes in `node`, itself included.
fn count(node: &Node) -> usize {
    match node {
        Node::Scalar { .. } => 1,
        Node::Seq(items) => 1 + items.iter().map(count).sum::<usize>(),
        Node::Map(entries) => 1 + entries.iter().map(|(_, v)| count(v)).sum::<usize>(),
    }
}

/// YAML 1.2 core schema's null.
fn is_null(text: &str) -> bool {
    matches!(text, "" | "~" | "null" | "Null" | "NULL")
}

/// YAML 1.2 core schema's booleans.
fn as_bool(text: &str) -> Option<bool> {
    match text {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

impl Node {
    fn plain_null(&self) -> bool {
        matches!(self, Node::Scalar { text, plain: true } if is_null(text))
    }

    fn kind(&self) -> de::Unexpected<'_> {
        match self {
            Node::Scalar { text, .. } => de::Unexpected::Str(text),
            Node::Seq(_) => de::Unexpected::Seq,
            Node::Map(_) => de::Unexpected::Map,
        }
    }

    /// The scalar's text, or an error naming what was found instead of `exp`.
    fn text(self, exp: &dyn de::Expected) -> Result<String, YamlError> {
        match self {
            Node::Scalar { text, .. } => Ok(text),
            other => Err(de::Error::invalid_type(other.kind(), exp)),
        }
    }
}

macro_rules! parsed {
    ($($method:ident $visit:ident $ty:ty),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, YamlError> {
            let text = self.text(&visitor)?;
            match text.trim().parse::<$ty>() {
                Ok(n) => visitor.$visit(n),
                Err(_) => Err(de::Error::invalid_value(de::Unexpected::Str(&text), &visitor)),
            }
        }
    )*};
}

impl<'de> de::Deserializer<'de> for Node {
    type Error = YamlError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, YamlError> {
        match self {
            Node::Scalar { text, plain: true } => {
                if is_null(&text) {
                    visitor.visit_unit()
                } else if let Some(b) = as_bool(&text) {
                    visitor.visit_bool(b)
                } else if let Ok(n) = text.parse::<i64>() {
                    visitor.visit_i64(n)
                } else if let Ok(n) = text.parse::<u64>() {
                    visitor.visit_u64(n)
                } else if let Some(n) = text.parse::<f64>().ok().filter(|_| {
                    text.bytes()
                        .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b))
                }) {
                    visitor.visit_f64(n)
                } else {
                    visitor.visit_string(text)
                }
            }
            Node::Scalar { text, plain: false } => visitor.visit_string(text),
            Node::Seq(items) => visitor.visit_seq(Items(items.into_iter().enumerate())),
            Node::Map(entries) => visitor.visit_map(Entries::new(entries)),
        }
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, YamlError> {
        let text = self.text(&visitor)?;
        match as_bool(&text) {
            Some(b) => visitor.visit_bool(b),
            None => Err(de::Error::invalid_value(
                de::Unexpected::Str(&text),
                &visitor,
            )),
        }
    }

    parsed! {
        deserialize_i8 visit_i8 i8, deserialize_i16 visit_i16 i16,
        deserialize_i32 visit_i32 i32, deserialize_i64 visit_i64 i64,
        deserialize_u8 visit_u8 u8, deserialize_u16 visit_u16 u16,
        deserialize_u32 visit_u32 u32, deserialize_u64 visit_u64 u64,
        deserialize_f32 visit_f32 f32, deserialize_f64 visit_f64 f64,
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, YamlError> {
        self.deserialize_string(visitor)
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, YamlError> {
        visitor.visit_string(self.text(&"a string")?)
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, YamlError> {
        self.deserialize_string(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, YamlError> {
        if self.plain_null() {
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, YamlError> {
        if self.plain_null() {
            visitor.visit_unit()
        } else {
            Err(de::Error::invalid_type(self.kind(), &visitor))
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, YamlError> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, YamlError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, YamlError> {
        match self {
            Node::Scalar { text, .. } => visitor.visit_enum(text.into_deserializer()),
            Node::Map(entries) => {
                visitor.visit_enum(de::value::MapAccessDeserializer::new(Entries::new(entries)))
            }
            other => Err(de::Error::invalid_type(other.kind(), &visitor)),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, YamlError> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        i128 u128 bytes byte_buf seq tuple tuple_struct map struct identifier
    }
}

/// A sequence's items, an error naming the item's index.
struct Items(std::iter::Enumerate<std::vec::IntoIter<Node>>);

impl<'de> de::SeqAccess<'de> for Items {
    type Error = YamlError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, YamlError> {
        match self.0.next() {
            None => Ok(None),
            Some((i, node)) => seed
                .deserialize(node)
                .map(Some)
                .map_err(|e| e.under(&format!("[{i}]"))),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

/// A mapping's entries, an error naming the key.
struct Entries {
    entries: std::vec::IntoIter<(String, Node)>,
    /// The entry whose key was read, its value not yet.
    value: Option<(String, Node)>,
}

impl Entries {
    fn new(entries: Vec<(String, Node)>) -> Entries {
        Entries {
            entries: entries.into_iter(),
            value: None,
        }
    }
}

impl<'de> de::MapAccess<'de> for Entries {
    type Error = YamlError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, YamlError> {
        let Some((key, value)) = self.entries.next() else {
            return Ok(None);
        };
        let text = Node::Scalar {
            text: key.clone(),
            plain: false,
        };
        let read = seed.deserialize(text).map_err(|e| e.under(&key))?;
        self.value = Some((key, value));
        Ok(Some(read))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, YamlError> {
        let (key, value) = self
            .value
            .take()
            .ok_or_else(|| de::Error::custom("a value asked for before its key"))?;
        seed.deserialize(value).map_err(|e| e.under(&key))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}

#[cfg(test)]
mod tests;
