//! Chat templates: Jinja rendered with minijinja the way `transformers` renders them
//! (`trim_blocks`, `lstrip_blocks`, `raise_exception`, `strftime_now`, a Python-style
//! `tojson`, Python string/dict/list methods).

use std::io;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::Kwargs;
use minijinja::{AutoEscape, Environment, ErrorKind, Value};

use crate::error::{Error, Result};

const NAME: &str = "chat_template";

/// One compiled chat template.
pub(crate) struct ChatTemplate {
    env: Environment<'static>,
    source: String,
}

impl ChatTemplate {
    /// Compile `source`; `origin` (a file path) names it in errors.
    pub(crate) fn new(source: String, origin: &str) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.clone())
            .map_err(|e| Error::Tokenizer(format!("chat template from `{origin}`: {e}")))?;
        Ok(ChatTemplate { env, source })
    }

    /// The Jinja source.
    pub(crate) fn source(&self) -> &str {
        &self.source
    }

    /// Render with the variables of `ctx`.
    pub(crate) fn render(&self, ctx: Value) -> Result<String> {
        self.env
            .get_template(NAME)
            .and_then(|t| t.render(ctx))
            .map_err(|e| Error::Tokenizer(format!("chat template: {e}")))
    }
}

/// `raise_exception(msg)`: templates use it to reject a conversation (e.g. roles that do
/// not alternate); it fails the render with `msg`.
fn raise_exception(msg: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
}

/// `x | tojson(indent=None, ensure_ascii=False, sort_keys=False)` as Python's
/// `json.dumps` writes it: `", "` and `": "` separators, or `indent` spaces per level.
/// Keys keep their order, as in Python's dicts, unless `sort_keys`.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let sorted;
    let value = if sort_keys == Some(true) {
        let mut v = serde_json::to_value(value).map_err(|e| {
            minijinja::Error::new(ErrorKind::BadSerialization, "tojson failed").with_source(e)
        })?;
        sort_keys_deep(&mut v);
        sorted = Value::from_serialize(&v);
        &sorted
    } else {
        value
    };
    let mut out = Vec::new();
    let written = match indent {
        Some(n) => {
            let spaces = vec![b' '; n];
            let fmt = serde_json::ser::PrettyFormatter::with_indent(&spaces);
            serde::Serialize::serialize(
                value,
                &mut serde_json::Serializer::with_formatter(&mut out, fmt),
            )
        }
        None => serde::Serialize::serialize(
            value,
            &mut serde_json::Serializer::with_formatter(&mut out, PyCompact),
        ),
    };
    written.map_err(|e| {
        minijinja::Error::new(ErrorKind::BadSerialization, "tojson failed").with_source(e)
    })?;
    let mut s = String::from_utf8(out).expect("serde_json writes UTF-8");
    if ensure_ascii == Some(true) {
        s = escape_non_ascii(&s);
    }
    Ok(Value::from_safe_string(s))
}

/// Sort every object's keys, at every depth.
fn sort_keys_deep(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(o) => {
            o.sort_keys();
            o.values_mut().for_each(sort_keys_deep);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(sort_keys_deep),
        _ => {}
    }
}

/// Python's compact `json.dumps` separators: `", "` between items, `": "` after keys.
struct PyCompact;

impl serde_json::ser::Formatter for PyCompact {
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }
}

/// `\uXXXX` (UTF-16, surrogate pairs above the BMP) for every non-ASCII character. Only
/// string contents can hold one, so this is safe on serialized JSON.
fn escape_non_ascii(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out
}

/// `strftime_now(format)`: the current time formatted with Python's `strftime` codes
/// `%Y %y %m %d %e %H %I %M %S %p %j %b %B %a %A %%`. NOTE: in UTC, where `transformers`
/// uses the host's local time zone.
fn strftime_now(format: String) -> Result<Value, minijinja::Error> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    strftime(&format, secs).map(Value::from)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Format `unix_secs` (UTC) with the `strftime` codes [`strftime_now`] lists.
pub(crate) fn strftime(format: &str, unix_secs: u64) -> Result<String, minijinja::Error> {
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    let (year, month, day) = civil_from_days(days);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let code = chars.next().unwrap_or('%');
        let piece = match code {
            'Y' => year.to_string(),
            'y' => format!("{:02}", year.rem_euclid(100)),
            'm' => format!("{month:02}"),
            'd' => format!("{day:02}"),
            'e' => format!("{day:>2}"),
            'H' => format!("{h:02}"),
            'I' => format!("{:02}", (h + 11) % 12 + 1),
            'M' => format!("{m:02}"),
            'S' => format!("{s:02}"),
            'p' => (if h < 12 { "AM" } else { "PM" }).to_string(),
            'j' => format!("{yday:03}"),
            'b' => MONTHS[month as usize - 1][..3].to_string(),
            'B' => MONTHS[month as usize - 1].to_string(),
            'a' => WEEKDAYS[weekday][..3].to_string(),
            'A' => WEEKDAYS[weekday].to_string(),
            '%' => "%".to_string(),
            other => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: unsupported format code %{other}"),
                ))
            }
        };
        out.push_str(&piece);
    }
    Ok(out)
}

/// (year, month 1..=12, day 1..=31) of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Days since 1970-01-01 of a date (the inverse of [`civil_from_days`]).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_matches_known_dates() {
        // 2024-07-26 13:05:09 UTC, a Friday, day 208.
        let t = 1_722_085_509 - 86_400;
        assert_eq!(
            strftime("%d %b %Y|%A %a %B %m %y %j %H:%M:%S %I%p %%", t).unwrap(),
            "26 Jul 2024|Friday Fri July 07 24 208 13:05:09 01PM %"
        );
        assert_eq!(strftime("%Y-%m-%d", 0).unwrap(), "1970-01-01");
        // 2000-02-29 (a leap day) 00:00 UTC.
        assert_eq!(
            strftime("%Y-%m-%d %j %a", 951_782_400).unwrap(),
            "2000-02-29 060 Tue"
        );
        assert!(strftime("%Q", 0).is_err());
    }

    #[test]
    fn tojson_writes_like_python_json_dumps() {
        let t = ChatTemplate::new(
            "{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ 'é<' | tojson(ensure_ascii=true) }}|{{ x | tojson(sort_keys=true) }}"
                .into(),
            "test",
        )
        .unwrap();
        let x = serde_json::json!({"b": [1, "two", null, true], "a": {"k": 1.5}});
        let ctx: Value = [("x", Value::from_serialize(&x))].into_iter().collect();
        assert_eq!(
            t.render(ctx).unwrap(),
            "{\"b\": [1, \"two\", null, true], \"a\": {\"k\": 1.5}}|{\n  \"b\": [\n    1,\n    \
             \"two\",\n    null,\n    true\n  ],\n  \"a\": {\n    \"k\": 1.5\n  }\n}|\"\\u00e9<\"|{\"a\": {\"k\": \
             1.5}, \"b\": [1, \"two\", null, true]}"
        );
    }
}
