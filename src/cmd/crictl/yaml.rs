//! YAML as crictl prints it: the JSON output re-encoded by `sigs.k8s.io/yaml.JSONToYAML`,
//! which is Go's `gopkg.in/yaml.v2`: keys sorted in yaml.v2's "natural" order, block style with
//! sequences flush with their parent key, strings quoted only when a plain scalar would read
//! as something else (`"0"`, `"yes"`, `"2026-11-30T17:00:00Z"`, `'@x'`), multi-line strings
//! as `|` blocks, and long plain strings folded after column 80.
//!
//! The quoting rules are libyaml's (`yaml_emitter_analyze_scalar`,
//! `yaml_emitter_select_scalar_style`) and yaml.v2's `resolve`, ported for the JSON subset.

use super::format::go_format_g_shortest;
use super::json::Json;

/// Column after which yaml.v2 folds long scalars (`best_width`).
const BEST_WIDTH: usize = 80;
/// Indentation step.
const INDENT: usize = 2;
/// Longest key written as a simple `key: value` (libyaml `yaml_emitter_check_simple_key`).
const MAX_SIMPLE_KEY: usize = 128;

/// The YAML document of `v`, ending in a newline (crictl prints one more after it).
pub fn to_yaml(v: &Json) -> String {
    let mut e = Emitter::default();
    match v {
        Json::Obj(m) if !m.is_empty() => e.mapping(m, 0, true),
        Json::Arr(a) if !a.is_empty() => e.sequence(a, 0, true),
        other => {
            let s = e.scalar_text(other);
            e.scalar(&s, 0, Context::Value);
        }
    }
    e.out.push('\n');
    e.out
}

/// How yaml.v2 orders map keys (`keyList.Less` in `sorter.go`): runs of digits compare as
/// numbers, and a letter sorts after any non-letter.
pub fn key_less(a: &str, b: &str) -> bool {
    let ar: Vec<char> = a.chars().collect();
    let br: Vec<char> = b.chars().collect();
    let digit = |c: char| c.is_ascii_digit();
    let mut i = 0;
    while i < ar.len() && i < br.len() {
        if ar[i] == br[i] {
            i += 1;
            continue;
        }
        let al = ar[i].is_alphabetic();
        let bl = br[i].is_alphabetic();
        if al && bl {
            return ar[i] < br[i];
        }
        if al || bl {
            return bl;
        }
        let (mut an, mut bn): (i64, i64) = (0, 0);
        if ar[i] == '0' || br[i] == '0' {
            let mut j = i;
            while j > 0 && digit(ar[j - 1]) {
                j -= 1;
                if ar[j] != '0' {
                    an = 1;
                    bn = 1;
                    break;
                }
            }
        }
        let mut ai = i;
        while ai < ar.len() && digit(ar[ai]) {
            an = an
                .wrapping_mul(10)
                .wrapping_add(i64::from(ar[ai] as u8 - b'0'));
            ai += 1;
        }
        let mut bi = i;
        while bi < br.len() && digit(br[bi]) {
            bn = bn
                .wrapping_mul(10)
                .wrapping_add(i64::from(br[bi] as u8 - b'0'));
            bi += 1;
        }
        if an != bn {
            return an < bn;
        }
        if ai != bi {
            return ai < bi;
        }
        return ar[i] < br[i];
    }
    ar.len() < br.len()
}

// === what a plain scalar would mean ===

/// Whether `s`, written plain, would read back as a string (yaml.v2 `resolve` gives `!!str`
/// and it is no base-60 float).
fn reads_as_string(s: &str) -> bool {
    const SPECIAL: &[&str] = &[
        "y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON", "n", "N", "no",
        "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF", "", "~", "null", "Null",
        "NULL", ".nan", ".NaN", ".NAN", ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", "-.inf",
        "-.Inf", "-.INF",
    ];
    let Some(first) = s.bytes().next() else {
        return false;
    };
    let hinted =
        matches!(first, b'+' | b'-' | b'0'..=b'9' | b'.') || b"yYnNtTfFoO~".contains(&first);
    if !hinted {
        return true;
    }
    if SPECIAL.contains(&s) {
        return false;
    }
    match first {
        b'.' => !is_go_float(s),
        b'+' | b'-' | b'0'..=b'9' => {
            if is_timestamp(s) {
                return false;
            }
            let plain = s.replace('_', "");
            !(is_go_int(&plain) || is_yaml_float(&plain) || is_base60_float(s))
        }
        _ => true,
    }
}

fn all_digits(s: &str, radix: u32) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_digit(radix))
}

/// `strconv.ParseInt(s, 0, 64)` or `ParseUint(s, 0, 64)` accepts `s` (underscores removed).
fn is_go_int(s: &str) -> bool {
    let (signed, body) = match s.strip_prefix(['+', '-']) {
        Some(b) => (true, b),
        None => (false, s),
    };
    let lower = body.to_ascii_lowercase();
    let (radix, digits) = if let Some(d) = lower.strip_prefix("0x") {
        (16, d.to_string())
    } else if let Some(d) = lower.strip_prefix("0b") {
        (2, d.to_string())
    } else if let Some(d) = lower.strip_prefix("0o") {
        (8, d.to_string())
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, lower[1..].to_string())
    } else {
        (10, lower.clone())
    };
    if !all_digits(&digits, radix) {
        return false;
    }
    let Ok(v) = u128::from_str_radix(&digits, radix) else {
        return false;
    };
    if signed {
        // ParseUint takes no sign; ParseInt's range is that of int64
        v <= u128::from(i64::MAX as u64) + u128::from(s.starts_with('-'))
    } else {
        v <= u128::from(u64::MAX)
    }
}

/// yaml.v2's `yamlStyleFloat`: `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`.
fn is_yaml_float(s: &str) -> bool {
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let (mantissa, exp) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let mantissa_ok = match mantissa.split_once('.') {
        Some(("", frac)) => all_digits(frac, 10),
        Some((int, frac)) => all_digits(int, 10) && frac.chars().all(|c| c.is_ascii_digit()),
        None => all_digits(mantissa, 10),
    };
    let exp_ok = exp.is_none_or(|e| all_digits(e.strip_prefix(['+', '-']).unwrap_or(e), 10));
    mantissa_ok && exp_ok
}

/// `strconv.ParseFloat(s, 64)` accepts `s`, which starts with `.` (decimal forms only).
fn is_go_float(s: &str) -> bool {
    is_yaml_float(s)
}

/// yaml.v2's base-60 floats (`1:20`, `-1:20:30.5`), which it quotes.
fn is_base60_float(s: &str) -> bool {
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let (head, frac) = match s.split_once('.') {
        Some((h, f)) => (h, Some(f)),
        None => (s, None),
    };
    if frac.is_some_and(|f| !f.chars().all(|c| c.is_ascii_digit() || c == '_')) {
        return false;
    }
    let mut parts = head.split(':');
    let first = parts.next().unwrap_or_default();
    if !first.starts_with(|c: char| c.is_ascii_digit())
        || !first.chars().all(|c| c.is_ascii_digit() || c == '_')
    {
        return false;
    }
    let rest: Vec<&str> = parts.collect();
    !rest.is_empty()
        && rest.iter().all(|p| {
            let b = p.as_bytes();
            match b.len() {
                1 => b[0].is_ascii_digit(),
                2 => (b'0'..=b'5').contains(&b[0]) && b[1].is_ascii_digit(),
                _ => false,
            }
        })
}

/// yaml.v2's `parseTimestamp`: `YYYY-M-D`, optionally with a time (`T`/`t` and a zone, or a
/// space and no zone).
fn is_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() < 5 || !b[..4].iter().all(u8::is_ascii_digit) || b[4] != b'-' {
        return false;
    }
    let num = |t: &str, max_len: usize| -> Option<u32> {
        (!t.is_empty() && t.len() <= max_len && t.bytes().all(|c| c.is_ascii_digit()))
            .then(|| t.parse().ok())
            .flatten()
    };
    let (date, time) = match s.find(['T', 't', ' ']) {
        Some(i) => (&s[..i], Some((b[i], &s[i + 1..]))),
        None => (s, None),
    };
    let d: Vec<&str> = date.split('-').collect();
    let [y, m, dd] = d.as_slice() else {
        return false;
    };
    let (Some(y), Some(m), Some(dd)) = (num(y, 4), num(m, 2), num(dd, 2)) else {
        return false;
    };
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&m) || dd == 0 || dd > days[(m - 1) as usize] {
        return false;
    }
    let Some((sep, time)) = time else {
        return true;
    };
    let (clock, zone_ok) = if sep == b' ' {
        (time, true)
    } else if let Some(c) = time.strip_suffix(['Z', 'z']) {
        (c, true)
    } else {
        match time.rfind(['+', '-']) {
            Some(i) => {
                let z = &time[i + 1..];
                let ok = z.len() == 5
                    && z.as_bytes()[2] == b':'
                    && num(&z[..2], 2).is_some()
                    && num(&z[3..], 2).is_some();
                (&time[..i], ok)
            }
            None => (time, false),
        }
    };
    let (hms, frac) = match clock.split_once('.') {
        Some((h, f)) => (h, Some(f)),
        None => (clock, None),
    };
    let t: Vec<&str> = hms.split(':').collect();
    let [h, mi, se] = t.as_slice() else {
        return false;
    };
    zone_ok
        && num(h, 2).is_some_and(|v| v < 24)
        && num(mi, 2).is_some_and(|v| v < 60)
        && num(se, 2).is_some_and(|v| v < 60)
        && frac.is_none_or(|f| num(f, 9).is_some())
}

// === how a string may be written ===

fn is_printable(c: char) -> bool {
    matches!(c, '\n' | '\u{20}'..='\u{7e}' | '\u{a0}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}')
        && c != '\u{feff}'
}

fn is_break(c: char) -> bool {
    matches!(c, '\r' | '\n' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

/// What libyaml's analysis allows for a scalar.
struct Analysis {
    multiline: bool,
    block_plain: bool,
    single_quoted: bool,
    block: bool,
}

fn analyze(s: &str) -> Analysis {
    if s.is_empty() {
        return Analysis {
            multiline: false,
            block_plain: true,
            single_quoted: true,
            block: false,
        };
    }
    let chars: Vec<char> = s.chars().collect();
    let mut block_indicators = s.starts_with("---") || s.starts_with("...");
    let (mut line_breaks, mut special) = (false, false);
    let (mut leading_space, mut leading_break) = (false, false);
    let (mut trailing_space, mut trailing_break) = (false, false);
    let (mut break_space, mut space_break) = (false, false);
    let (mut previous_space, mut previous_break) = (false, false);
    let mut preceded_by_whitespace = true;
    for (i, &c) in chars.iter().enumerate() {
        let next = chars.get(i + 1).copied();
        let followed_by_whitespace = next.is_none_or(|n| n == ' ' || n == '\t' || is_break(n));
        if i == 0 {
            match c {
                '#' | ',' | '[' | ']' | '{' | '}' | '&' | '*' | '!' | '|' | '>' | '\'' | '"'
                | '%' | '@' | '`' => block_indicators = true,
                '?' | ':' | '-' if followed_by_whitespace => block_indicators = true,
                _ => {}
            }
        } else {
            match c {
                ':' if followed_by_whitespace => block_indicators = true,
                '#' if preceded_by_whitespace => block_indicators = true,
                _ => {}
            }
        }
        if !is_printable(c) {
            special = true;
        }
        let last = i + 1 == chars.len();
        if c == ' ' {
            leading_space |= i == 0;
            trailing_space |= last;
            break_space |= previous_break;
            previous_space = true;
            previous_break = false;
        } else if is_break(c) {
            line_breaks = true;
            leading_break |= i == 0;
            trailing_break |= last;
            space_break |= previous_space;
            previous_space = false;
            previous_break = true;
        } else {
            previous_space = false;
            previous_break = false;
        }
        preceded_by_whitespace = c == ' ' || c == '\t' || is_break(c) || c == '\0';
    }
    let mut a = Analysis {
        multiline: line_breaks,
        block_plain: true,
        single_quoted: true,
        block: true,
    };
    if leading_space || leading_break || trailing_space || trailing_break {
        a.block_plain = false;
    }
    if trailing_space {
        a.block = false;
    }
    if break_space {
        a.block_plain = false;
        a.single_quoted = false;
    }
    if space_break || special {
        a.block_plain = false;
        a.single_quoted = false;
        a.block = false;
    }
    if line_breaks || block_indicators {
        a.block_plain = false;
    }
    a
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Style {
    Plain,
    Single,
    Double,
    Literal,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    /// A simple `key:` (no folding, no blocks).
    SimpleKey,
    /// A value, or a complex key.
    Value,
}

/// The style yaml.v2 writes a string in.
fn string_style(s: &str, ctx: Context) -> Style {
    let wanted = if s.contains('\n') {
        Style::Literal
    } else if reads_as_string(s) && !is_base60_float(s) {
        Style::Plain
    } else {
        Style::Double
    };
    let a = analyze(s);
    let mut style = wanted;
    if ctx == Context::SimpleKey && a.multiline {
        style = Style::Double;
    }
    if style == Style::Plain && !a.block_plain {
        style = Style::Single;
    }
    if style == Style::Plain && s.is_empty() && ctx == Context::SimpleKey {
        style = Style::Single;
    }
    if style == Style::Single && !a.single_quoted {
        style = Style::Double;
    }
    if style == Style::Literal && (!a.block || ctx == Context::SimpleKey) {
        style = Style::Double;
    }
    style
}

/// A scalar ready to write: its text and whether it is a string (quoting applies).
enum Scalar {
    Text(String),
    Str(String),
}

#[derive(Default)]
struct Emitter {
    out: String,
    column: usize,
}

impl Emitter {
    fn push(&mut self, s: &str) {
        match s.rfind('\n') {
            Some(i) => self.column = s[i + 1..].chars().count(),
            None => self.column += s.chars().count(),
        }
        self.out.push_str(s);
    }

    fn push_char(&mut self, c: char) {
        self.out.push(c);
        if c == '\n' {
            self.column = 0;
        } else {
            self.column += 1;
        }
    }

    fn newline_indent(&mut self, indent: usize) {
        self.push_char('\n');
        self.push(&" ".repeat(indent));
    }

    fn scalar_text(&self, v: &Json) -> Scalar {
        match v {
            Json::Null => Scalar::Text("null".into()),
            Json::Bool(b) => Scalar::Text(b.to_string()),
            Json::Num(n) => Scalar::Text(yaml_number(n)),
            Json::Str(s) => Scalar::Str(s.clone()),
            // containers are not scalars; callers never pass them
            Json::Arr(_) => Scalar::Text("[]".into()),
            Json::Obj(_) => Scalar::Text("{}".into()),
        }
    }

    fn scalar(&mut self, s: &Scalar, indent: usize, ctx: Context) {
        match s {
            Scalar::Text(t) => self.push(t),
            Scalar::Str(s) => match string_style(s, ctx) {
                Style::Plain => self.plain(s, indent, ctx == Context::Value),
                Style::Single => self.single(s, indent, ctx == Context::Value),
                Style::Double => self.double(s, indent, ctx == Context::Value),
                Style::Literal => self.literal(s, indent),
            },
        }
    }

    fn plain(&mut self, s: &str, indent: usize, allow_breaks: bool) {
        let chars: Vec<char> = s.chars().collect();
        let mut spaces = false;
        for (i, &c) in chars.iter().enumerate() {
            if c == ' ' {
                let next_space = chars.get(i + 1) == Some(&' ');
                if allow_breaks && !spaces && self.column > BEST_WIDTH && !next_space {
                    self.newline_indent(indent);
                } else {
                    self.push_char(c);
                }
                spaces = true;
            } else {
                self.push_char(c);
                spaces = false;
            }
        }
    }

    fn single(&mut self, s: &str, indent: usize, allow_breaks: bool) {
        let chars: Vec<char> = s.chars().collect();
        self.push_char('\'');
        let mut spaces = false;
        for (i, &c) in chars.iter().enumerate() {
            if c == ' ' {
                let fold = allow_breaks
                    && !spaces
                    && self.column > BEST_WIDTH
                    && i > 0
                    && i + 1 < chars.len()
                    && chars.get(i + 1) != Some(&' ');
                if fold {
                    self.newline_indent(indent);
                } else {
                    self.push_char(c);
                }
                spaces = true;
            } else {
                if c == '\'' {
                    self.push_char('\'');
                }
                self.push_char(c);
                spaces = false;
            }
        }
        self.push_char('\'');
    }

    fn double(&mut self, s: &str, indent: usize, allow_breaks: bool) {
        let chars: Vec<char> = s.chars().collect();
        self.push_char('"');
        let mut spaces = false;
        for (i, &c) in chars.iter().enumerate() {
            if !is_printable(c) || c == '\u{feff}' || is_break(c) || c == '"' || c == '\\' {
                let esc = match c {
                    '\0' => "\\0".to_string(),
                    '\u{7}' => "\\a".into(),
                    '\u{8}' => "\\b".into(),
                    '\t' => "\\t".into(),
                    '\n' => "\\n".into(),
                    '\u{b}' => "\\v".into(),
                    '\u{c}' => "\\f".into(),
                    '\r' => "\\r".into(),
                    '\u{1b}' => "\\e".into(),
                    '"' => "\\\"".into(),
                    '\\' => "\\\\".into(),
                    '\u{85}' => "\\N".into(),
                    '\u{a0}' => "\\_".into(),
                    '\u{2028}' => "\\L".into(),
                    '\u{2029}' => "\\P".into(),
                    c if (c as u32) <= 0xff => format!("\\x{:02X}", c as u32),
                    c if (c as u32) <= 0xffff => format!("\\u{:04X}", c as u32),
                    c => format!("\\U{:08X}", c as u32),
                };
                self.push(&esc);
                spaces = false;
            } else if c == ' ' {
                let fold = allow_breaks
                    && !spaces
                    && self.column > BEST_WIDTH
                    && i > 0
                    && i + 1 < chars.len();
                if fold {
                    self.newline_indent(indent);
                    if chars.get(i + 1) == Some(&' ') {
                        self.push_char('\\');
                    }
                } else {
                    self.push_char(c);
                }
                spaces = true;
            } else {
                self.push_char(c);
                spaces = false;
            }
        }
        self.push_char('"');
    }

    fn literal(&mut self, s: &str, indent: usize) {
        self.push_char('|');
        let starts_blank = s.starts_with(' ') || s.starts_with(is_break);
        if starts_blank {
            self.push(&INDENT.to_string());
        }
        let chars: Vec<char> = s.chars().collect();
        let n = chars.len();
        if !chars.last().copied().is_some_and(is_break) {
            self.push_char('-');
        } else if n == 1 || chars.get(n - 2).copied().is_some_and(is_break) {
            self.push_char('+');
        }
        self.push_char('\n');
        let mut at_line_start = true;
        for c in chars {
            if is_break(c) {
                self.push_char('\n');
                at_line_start = true;
            } else {
                if at_line_start {
                    self.push(&" ".repeat(indent));
                    at_line_start = false;
                }
                self.push_char(c);
            }
        }
    }

    fn key(&mut self, k: &str, indent: usize) {
        let simple = k.len() <= MAX_SIMPLE_KEY && !analyze(k).multiline;
        if simple {
            self.scalar(&Scalar::Str(k.to_string()), indent, Context::SimpleKey);
            self.push_char(':');
        } else {
            self.push("? ");
            self.scalar(&Scalar::Str(k.to_string()), indent + INDENT, Context::Value);
            if self.column != 0 {
                self.newline_indent(indent);
            } else {
                self.push(&" ".repeat(indent));
            }
            self.push_char(':');
        }
    }

    fn mapping(&mut self, members: &[(String, Json)], indent: usize, first_inline: bool) {
        let mut sorted: Vec<&(String, Json)> = members.iter().collect();
        sorted.sort_by(|a, b| {
            if key_less(&a.0, &b.0) {
                std::cmp::Ordering::Less
            } else if key_less(&b.0, &a.0) {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        });
        for (i, (k, v)) in sorted.into_iter().enumerate() {
            if i > 0 || !first_inline {
                if self.column == 0 && self.out.ends_with('\n') {
                    self.push(&" ".repeat(indent));
                } else {
                    self.newline_indent(indent);
                }
            }
            self.key(k, indent);
            match v {
                Json::Obj(m) if !m.is_empty() => self.mapping(m, indent + INDENT, false),
                Json::Arr(a) if !a.is_empty() => self.sequence(a, indent, false),
                Json::Obj(_) => self.push(" {}"),
                Json::Arr(_) => self.push(" []"),
                scalar => {
                    self.push_char(' ');
                    let s = self.scalar_text(scalar);
                    self.scalar(&s, indent + INDENT, Context::Value);
                }
            }
        }
    }

    fn sequence(&mut self, items: &[Json], indent: usize, first_inline: bool) {
        for (i, item) in items.iter().enumerate() {
            if i > 0 || !first_inline {
                if self.column == 0 && self.out.ends_with('\n') {
                    self.push(&" ".repeat(indent));
                } else {
                    self.newline_indent(indent);
                }
            }
            self.push_char('-');
            match item {
                Json::Obj(m) if !m.is_empty() => {
                    self.push_char(' ');
                    self.mapping(m, indent + INDENT, true);
                }
                Json::Arr(a) if !a.is_empty() => {
                    self.push_char(' ');
                    self.sequence(a, indent + INDENT, true);
                }
                Json::Obj(_) => self.push(" {}"),
                Json::Arr(_) => self.push(" []"),
                scalar => {
                    self.push_char(' ');
                    let s = self.scalar_text(scalar);
                    self.scalar(&s, indent + INDENT, Context::Value);
                }
            }
        }
    }
}

/// A JSON number as yaml.v2 writes it after reading it back: integers as they are, anything
/// else as a float (`strconv.FormatFloat(f, 'g', -1, 64)`).
fn yaml_number(n: &str) -> String {
    if let Ok(i) = n.parse::<i64>() {
        return i.to_string();
    }
    if let Ok(u) = n.parse::<u64>() {
        return u.to_string();
    }
    match n.parse::<f64>() {
        Ok(f) => go_format_g_shortest(f),
        Err(_) => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> Json {
        Json::str(v)
    }

    /// What sigs.k8s.io/yaml.JSONToYAML printed for these values (recorded once).
    #[test]
    fn quoting_and_folding_match_yaml_v2() {
        let long = "aaaa bbbb cccc dddd eeee ffff gggg hhhh iiii jjjj kkkk llll mmmm nnnn oooo \
                    pppp qqqq rrrr ssss tttt uuuu";
        let v = Json::obj(vec![
            ("at", s("@x")),
            ("b", Json::Bool(true)),
            ("big", Json::Num("1796058714959500685".into())),
            ("bq", s("`x")),
            ("colon", s("a: b")),
            ("dash", s("- x")),
            ("empty", s("")),
            ("emptylist", Json::Arr(vec![])),
            ("emptyobj", Json::Obj(vec![])),
            ("f", Json::Num("1.5".into())),
            ("flt", s("1.5")),
            ("hash", s("#x")),
            ("int", Json::Num("42".into())),
            ("lead", s(" x")),
            (
                "list",
                Json::Arr(vec![Json::obj(vec![
                    ("a", Json::Num("1".into())),
                    (
                        "b",
                        Json::Arr(vec![Json::Num("1".into()), Json::Num("2".into())]),
                    ),
                ])]),
            ),
            ("long", s(long)),
            ("multi", s("l1\nl2\n")),
            ("n", Json::Null),
            ("nul", s("null")),
            ("num", s("123")),
            ("on", s("on")),
            ("pct", s("%x")),
            ("star", s("*x")),
            ("tilde", s("~")),
            ("ts", s("2026-11-30T17:00:00Z")),
            ("yes", s("yes")),
        ]);
        let want = "at: '@x'\nb: true\nbig: 1796058714959500685\nbq: '`x'\ncolon: 'a: b'\n\
                    dash: '- x'\nempty: \"\"\nemptylist: []\nemptyobj: {}\nf: 1.5\nflt: \"1.5\"\n\
                    hash: '#x'\nint: 42\nlead: ' x'\nlist:\n- a: 1\n  b:\n  - 1\n  - 2\n\
                    long: aaaa bbbb cccc dddd eeee ffff gggg hhhh iiii jjjj kkkk llll mmmm nnnn \
                    oooo pppp\n  qqqq rrrr ssss tttt uuuu\nmulti: |\n  l1\n  l2\n\"n\": null\n\
                    nul: \"null\"\nnum: \"123\"\n\"on\": \"on\"\npct: '%x'\nstar: '*x'\n\
                    tilde: \"~\"\nts: \"2026-11-30T17:00:00Z\"\n\"yes\": \"yes\"\n";
        assert_eq!(to_yaml(&v), want);
    }

    #[test]
    fn keys_sort_in_yaml_v2_natural_order() {
        let mut keys = vec!["a10", "a9", "b", "a_", "aB", "a.b", "ab", "A"];
        keys.sort_by(|a, b| {
            if key_less(a, b) {
                std::cmp::Ordering::Less
            } else {
                std::cmp::Ordering::Greater
            }
        });
        assert_eq!(keys, vec!["A", "a.b", "a_", "a9", "a10", "aB", "ab", "b"]);
    }

    #[test]
    fn scalars_that_read_as_other_types_are_quoted() {
        for quoted in [
            "0",
            "30",
            "-1",
            "0x1f",
            "1e5",
            "1_000",
            "08",
            ".5",
            "12:30",
            "2026-11-30",
            "true",
            "Off",
            "~",
            "",
        ] {
            assert!(!reads_as_string(quoted), "{quoted} must be quoted");
        }
        for plain in [
            "861cdbaeffe96",
            "127.0.0.1:5200/test/busybox:v1",
            "v1",
            "-x",
            "abc",
            "1.2.3",
            "2026-13-01",
            "/dev/termination-log",
        ] {
            assert!(reads_as_string(plain), "{plain} must stay plain");
        }
    }

    #[test]
    fn special_characters_and_multiline_strings() {
        let v = Json::obj(vec![
            ("tab", s("a\tb")),
            ("nl-space", s("a \nb")),
            ("nl", s("x\n")),
            ("keep", s("x\n\n")),
            ("strip", s("x\ny")),
            ("emoji", s("a😀")),
            ("html", s("a<b>&c \"quoted\" é ✓")),
        ]);
        assert_eq!(
            to_yaml(&v),
            "emoji: \"a\\U0001F600\"\nhtml: a<b>&c \"quoted\" é ✓\nkeep: |+\n  x\n\n\
             nl: |\n  x\nnl-space: \"a \\nb\"\nstrip: |-\n  x\n  y\ntab: \"a\\tb\"\n"
        );
    }

    #[test]
    fn nested_sequences_and_maps_indent_like_yaml_v2() {
        let v = Json::obj(vec![(
            "containers",
            Json::Arr(vec![Json::obj(vec![
                ("id", s("c1")),
                ("labels", Json::obj(vec![("a", s("1"))])),
                ("args", Json::Arr(vec![Json::Arr(vec![s("x"), s("y")])])),
            ])]),
        )]);
        assert_eq!(
            to_yaml(&v),
            "containers:\n- args:\n  - - x\n    - \"y\"\n  id: c1\n  labels:\n    a: \"1\"\n"
        );
    }
}
