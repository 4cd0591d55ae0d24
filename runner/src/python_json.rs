//! Python's `json.loads` and `json.dumps(value, separators=(",", ":"),
//! ensure_ascii=False)`, for the tool list upstream `render_example` writes into the
//! prompt. `serde_json` cannot stand in: it reads integers beyond 64 bits as floats
//! (`1.2345678901234568e+22` where Python keeps every digit), refuses `1E400` (Python:
//! `inf`, written `Infinity`) and the `NaN`/`Infinity` literals Python accepts, and its
//! `arbitrary_precision` feature would reach every crate of the workspace (features
//! unify) and break `tokenizers`' untagged enums.

use std::collections::HashMap;
use std::fmt::Write;

/// A value as Python's `json.loads` builds it.
#[derive(Clone, Debug, PartialEq)]
pub enum PyJson {
    Null,
    Bool(bool),
    /// An `int`, as Python's `str(int)` writes it (every digit; `-0` is `0`).
    Int(String),
    Float(f64),
    Str(String),
    Array(Vec<PyJson>),
    /// A `dict`: keys in first-seen order, a repeated key keeping its place and taking
    /// the last value.
    Object(Vec<(String, PyJson)>),
}

impl From<&serde_json::Value> for PyJson {
    /// The value Python would hold for a `serde_json` one (whose numbers are already
    /// 64-bit integers or floats).
    fn from(value: &serde_json::Value) -> Self {
        use serde_json::Value;
        match value {
            Value::Null => PyJson::Null,
            Value::Bool(b) => PyJson::Bool(*b),
            Value::Number(n) if n.is_f64() => PyJson::Float(n.as_f64().unwrap_or(f64::NAN)),
            Value::Number(n) => PyJson::Int(n.to_string()),
            Value::String(s) => PyJson::Str(s.clone()),
            Value::Array(items) => PyJson::Array(items.iter().map(PyJson::from).collect()),
            Value::Object(map) => PyJson::Object(
                map.iter()
                    .map(|(k, v)| (k.clone(), PyJson::from(v)))
                    .collect(),
            ),
        }
    }
}

/// Python refuses to convert longer digit strings to `int` (`sys.int_info`'s
/// `default_max_str_digits`), so `json.loads` refuses them.
const MAX_INT_DIGITS: usize = 4300;
/// Deeper nesting is refused instead of overflowing the stack (Python's recursion limit
/// stops near the same depth).
const MAX_DEPTH: usize = 1000;

/// Parses `text` as Python's `json.loads` does; the error says what and where
/// (`line L column C`, as Python counts).
pub fn loads(text: &str) -> Result<PyJson, String> {
    if text.starts_with('\u{feff}') {
        return Err("unexpected UTF-8 BOM at line 1 column 1".into());
    }
    let mut p = Parser { text, pos: 0 };
    p.skip_whitespace();
    let value = p.value(0)?;
    p.skip_whitespace();
    if p.pos < text.len() {
        return Err(p.error("extra data"));
    }
    Ok(value)
}

impl PyJson {
    /// `json.dumps(self, separators=(",", ":"), ensure_ascii=False)`.
    pub fn dumps_compact(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, false);
        out
    }

    /// `json.dumps(self, separators=(",", ":"))`: Python's default `ensure_ascii=True`
    /// writes every character outside `' '..='~'` as `\uXXXX` (UTF-16 surrogate pairs
    /// beyond the BMP).
    pub fn dumps_compact_ascii(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, true);
        out
    }

    fn write(&self, out: &mut String, ascii: bool) {
        match self {
            PyJson::Null => out.push_str("null"),
            PyJson::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            PyJson::Int(digits) => out.push_str(digits),
            PyJson::Float(f) => out.push_str(&python_float_json(*f)),
            PyJson::Str(s) => write_string(out, s, ascii),
            PyJson::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.write(out, ascii);
                }
                out.push(']');
            }
            PyJson::Object(members) => {
                out.push('{');
                for (i, (key, item)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_string(out, key, ascii);
                    out.push(':');
                    item.write(out, ascii);
                }
                out.push('}');
            }
        }
    }
}

/// How `json.dumps` writes a float: `NaN`, `Infinity`, `-Infinity`, else `repr`.
pub fn python_float_json(value: f64) -> String {
    match value {
        v if v.is_nan() => "NaN".into(),
        v if v == f64::INFINITY => "Infinity".into(),
        v if v == f64::NEG_INFINITY => "-Infinity".into(),
        v => python_float_repr(v),
    }
}

/// Python's `repr(float)` of a finite value: the shortest round-trip digits, positional
/// when the decimal exponent is in -4..16, else `d.ddde±XX`; integral values keep `.0`.
/// Where two digit strings of that length round-trip, Python takes the one nearer the
/// exact value, and the even one on a tie (`-2082229736969349.25` is `…349.2`); Rust's
/// shortest `{:e}` may take the other, so the digits are its length, correctly rounded.
fn python_float_repr(value: f64) -> String {
    let shortest = format!("{value:e}");
    let digits = shortest
        .split('e')
        .next()
        .map_or(1, |m| m.bytes().filter(u8::is_ascii_digit).count());
    let scientific = format!("{value:.*e}", digits.saturating_sub(1));
    let (mantissa, exponent) = scientific
        .split_once('e')
        .expect("{:e} always has an exponent");
    let exponent: i32 = exponent.parse().expect("{:e} exponent is an integer");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let digits = mantissa.replace('.', "");
    let point = exponent + 1;
    let body = if !(-3..=16).contains(&point) {
        let (first, rest) = digits.split_at(1);
        let fraction = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        format!("{first}{fraction}e{exp_sign}{:02}", exponent.abs())
    } else if point <= 0 {
        format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
    } else if point as usize >= digits.len() {
        format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
    } else {
        let (whole, fraction) = digits.split_at(point as usize);
        format!("{whole}.{fraction}")
    };
    format!("{sign}{body}")
}

/// A string as Python's `encode_basestring` (ensure_ascii=False) writes it: only `"`,
/// `\` and the C0 controls are escaped.
fn write_string(out: &mut String, s: &str, ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if c < ' ' || (ascii && c > '~') => {
                let mut units = [0; 2];
                for unit in c.encode_utf16(&mut units) {
                    write!(out, "\\u{unit:04x}").expect("writing to a String");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn error(&self, what: &str) -> String {
        let before = &self.text[..self.pos];
        let line = before.matches('\n').count() + 1;
        let column = before.chars().rev().take_while(|&c| c != '\n').count() + 1;
        format!("{what} at line {line} column {column}")
    }

    fn rest(&self) -> &str {
        &self.text[self.pos..]
    }

    fn skip_whitespace(&mut self) {
        let rest = self.rest();
        let trimmed = rest.trim_start_matches([' ', '\t', '\n', '\r']);
        self.pos += rest.len() - trimmed.len();
    }

    fn eat(&mut self, literal: &str) -> bool {
        let found = self.rest().starts_with(literal);
        if found {
            self.pos += literal.len();
        }
        found
    }

    fn value(&mut self, depth: usize) -> Result<PyJson, String> {
        if depth >= MAX_DEPTH {
            return Err(self.error("nested too deeply"));
        }
        match self.rest().chars().next() {
            Some('"') => Ok(PyJson::Str(self.string()?)),
            Some('{') => self.object(depth),
            Some('[') => self.array(depth),
            _ if self.eat("null") => Ok(PyJson::Null),
            _ if self.eat("true") => Ok(PyJson::Bool(true)),
            _ if self.eat("false") => Ok(PyJson::Bool(false)),
            Some('-' | '0'..='9') if self.number_len() > 0 => self.number(),
            _ if self.eat("NaN") => Ok(PyJson::Float(f64::NAN)),
            _ if self.eat("Infinity") => Ok(PyJson::Float(f64::INFINITY)),
            _ if self.eat("-Infinity") => Ok(PyJson::Float(f64::NEG_INFINITY)),
            _ => Err(self.error("expecting value")),
        }
    }

    /// Length of the longest match of Python's `-?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?`.
    fn number_len(&self) -> usize {
        let b = self.rest().as_bytes();
        let digits = |from: usize| b[from..].iter().take_while(|c| c.is_ascii_digit()).count();
        let mut i = usize::from(b.first() == Some(&b'-'));
        match b.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => i += digits(i),
            _ => return 0,
        }
        if b.get(i) == Some(&b'.') && digits(i + 1) > 0 {
            i += 1 + digits(i + 1);
        }
        if matches!(b.get(i), Some(b'e' | b'E')) {
            let sign = usize::from(matches!(b.get(i + 1), Some(b'+' | b'-')));
            let exp = digits(i + 1 + sign);
            if exp > 0 {
                i += 1 + sign + exp;
            }
        }
        i
    }

    fn number(&mut self) -> Result<PyJson, String> {
        let len = self.number_len();
        let lexeme = &self.rest()[..len];
        if lexeme.contains(['.', 'e', 'E']) {
            let value: f64 = lexeme.parse().expect("a JSON number is a Rust float");
            self.pos += len;
            return Ok(PyJson::Float(value));
        }
        let digits = lexeme.trim_start_matches('-');
        if digits.len() > MAX_INT_DIGITS {
            return Err(self.error(&format!(
                "an integer of {} digits (Python's json.loads refuses more than {MAX_INT_DIGITS})",
                digits.len()
            )));
        }
        let canonical = if digits == "0" { digits } else { lexeme }.to_string();
        self.pos += len;
        Ok(PyJson::Int(canonical))
    }

    fn array(&mut self, depth: usize) -> Result<PyJson, String> {
        self.pos += 1;
        self.skip_whitespace();
        let mut items = Vec::new();
        if self.eat("]") {
            return Ok(PyJson::Array(items));
        }
        loop {
            self.skip_whitespace();
            items.push(self.value(depth + 1)?);
            self.skip_whitespace();
            if self.eat("]") {
                return Ok(PyJson::Array(items));
            }
            if !self.eat(",") {
                return Err(self.error("expecting ',' delimiter"));
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<PyJson, String> {
        self.pos += 1;
        self.skip_whitespace();
        let mut members: Vec<(String, PyJson)> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        if self.eat("}") {
            return Ok(PyJson::Object(members));
        }
        loop {
            self.skip_whitespace();
            if !self.rest().starts_with('"') {
                return Err(self.error("expecting property name enclosed in double quotes"));
            }
            let key = self.string()?;
            self.skip_whitespace();
            if !self.eat(":") {
                return Err(self.error("expecting ':' delimiter"));
            }
            self.skip_whitespace();
            let value = self.value(depth + 1)?;
            match index.get(&key) {
                Some(&i) => members[i].1 = value,
                None => {
                    index.insert(key.clone(), members.len());
                    members.push((key, value));
                }
            }
            self.skip_whitespace();
            if self.eat("}") {
                return Ok(PyJson::Object(members));
            }
            if !self.eat(",") {
                return Err(self.error("expecting ',' delimiter"));
            }
        }
    }

    /// A string at the opening quote, as Python's strict `scanstring`: no raw control
    /// characters, `\uXXXX` pairs joined. A lone surrogate, which Python keeps, is refused:
    /// no prompt holding one can be encoded as UTF-8, upstream's included.
    fn string(&mut self) -> Result<String, String> {
        self.pos += 1;
        let mut out = String::new();
        loop {
            let Some(c) = self.rest().chars().next() else {
                return Err(self.error("unterminated string"));
            };
            match c {
                '"' => {
                    self.pos += 1;
                    return Ok(out);
                }
                '\\' => {
                    self.pos += 1;
                    out.push(self.escape()?);
                }
                c if c < ' ' => return Err(self.error("invalid control character")),
                c => {
                    out.push(c);
                    self.pos += c.len_utf8();
                }
            }
        }
    }

    /// The character of the escape after a backslash.
    fn escape(&mut self) -> Result<char, String> {
        let Some(c) = self.rest().chars().next() else {
            return Err(self.error("unterminated string"));
        };
        self.pos += c.len_utf8();
        let simple = match c {
            '"' => '"',
            '\\' => '\\',
            '/' => '/',
            'b' => '\u{8}',
            'f' => '\u{c}',
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            'u' => return self.unicode_escape(),
            _ => {
                self.pos -= c.len_utf8() + 1;
                return Err(self.error("invalid \\escape"));
            }
        };
        Ok(simple)
    }

    fn unicode_escape(&mut self) -> Result<char, String> {
        let high = self.hex4()?;
        if (0xd800..0xdc00).contains(&high) && self.rest().starts_with("\\u") {
            let resume = self.pos;
            self.pos += 2;
            let low = self.hex4()?;
            if (0xdc00..0xe000).contains(&low) {
                let code = 0x10000 + ((high - 0xd800) << 10) + (low - 0xdc00);
                return Ok(char::from_u32(code).expect("a surrogate pair is a scalar value"));
            }
            self.pos = resume;
        }
        char::from_u32(high).ok_or_else(|| {
            self.error(&format!(
                "lone surrogate \\u{high:04x} (a prompt holding it cannot be encoded as UTF-8)"
            ))
        })
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let hex = self
            .rest()
            .get(..4)
            .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
        let Some(hex) = hex else {
            return Err(self.error("invalid \\uXXXX escape"));
        };
        let value = u32::from_str_radix(hex, 16).expect("four hex digits");
        self.pos += 4;
        Ok(value)
    }
}
