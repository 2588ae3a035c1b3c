//! HF's `tojson` template filter: python `json.dumps(x, ensure_ascii=False, indent=None,
//! separators=None, sort_keys=False)`, which transformers installs in place of Jinja's
//! HTML-escaping one. The text must match python's byte for byte, since it is tokenized
//! (tool schemas in a system prompt): `", "` and `": "` separators without `indent`,
//! `","` plus newline and indentation with it, no HTML escaping, non-ASCII kept unless
//! `ensure_ascii`.
//!
//! Key order is the order of the value's map: serde_json and minijinja are built with
//! `preserve_order`, so objects come out in the client's order, as python's dicts do.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};
use std::fmt::Write;

/// Options of the filter (python keyword arguments).
struct Opts {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

/// `value | tojson(indent=None, ensure_ascii=False, separators=None, sort_keys=False)`;
/// `indent` may also be the first positional argument.
pub fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(n.clamp(0, 64) as usize)),
            (None, Some(s)) => Some(s.to_string()),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: bad indent",
                ))
            }
        },
    };
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let (item_sep, key_sep) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(v) if v.len() == 2 => (v[0].clone(), v[1].clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair",
            ))
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    kwargs.assert_all_used()?;
    let o = Opts {
        indent,
        item_sep,
        key_sep,
        ensure_ascii,
        sort_keys,
    };
    let mut out = String::new();
    write_value(&mut out, value, &o, 0)?;
    Ok(Value::from_safe_string(out))
}

fn write_value(out: &mut String, v: &Value, o: &Opts, depth: usize) -> Result<(), Error> {
    if depth > 256 {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: nested too deep",
        ));
    }
    match v.kind() {
        ValueKind::Undefined => {
            return Err(Error::new(
                ErrorKind::UndefinedError,
                "tojson: value is undefined",
            ))
        }
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, v),
        ValueKind::String => write_str(out, v.as_str().unwrap_or_default(), o.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            write_container(out, '[', ']', items.len(), o, depth, |out, i| {
                write_value(out, &items[i], o, depth + 1)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if o.sort_keys {
                keys.sort_by_key(|k| k.to_string());
            }
            write_container(out, '{', '}', keys.len(), o, depth, |out, i| {
                let k = &keys[i];
                match k.as_str() {
                    Some(s) => write_str(out, s, o.ensure_ascii),
                    None => write_str(out, &k.to_string(), o.ensure_ascii),
                }
                out.push_str(&o.key_sep);
                write_value(out, &v.get_item(k)?, o, depth + 1)
            })?;
        }
        _ => write_str(out, &v.to_string(), o.ensure_ascii),
    }
    Ok(())
}

fn write_container(
    out: &mut String,
    open: char,
    close: char,
    n: usize,
    o: &Opts,
    depth: usize,
    mut item: impl FnMut(&mut String, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if n == 0 {
        out.push(close);
        return Ok(());
    }
    for i in 0..n {
        if i > 0 {
            out.push_str(&o.item_sep);
        }
        if let Some(ind) = &o.indent {
            out.push('\n');
            for _ in 0..=depth {
                out.push_str(ind);
            }
        }
        item(out, i)?;
    }
    if let Some(ind) = &o.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(ind);
        }
    }
    out.push(close);
    Ok(())
}

/// Integers as python prints them; floats as python's `repr` (`1.0`, `0.5`, `1e+20`).
fn write_number(out: &mut String, v: &Value) {
    if v.is_integer() {
        let _ = write!(out, "{v}");
        return;
    }
    let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
    if f.is_nan() {
        out.push_str("NaN");
    } else if f.is_infinite() {
        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
    } else {
        let abs = f.abs();
        if abs != 0.0 && !(1e-4..1e16).contains(&abs) {
            // python: mantissa 'e' sign two-digit exponent.
            let s = format!("{f:e}");
            let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
            let (sign, digits) = match e.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', e),
            };
            let _ = write!(out, "{m}e{sign}{digits:0>2}");
        } else {
            let _ = write!(out, "{f:?}");
        }
    }
}

fn write_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7e) => {
                let mut buf = [0u16; 2];
                for u in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}
