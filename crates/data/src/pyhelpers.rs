//! The Python-side helpers that Hugging Face chat templates call, for minijinja.
//!
//! Mirrors transformers' `render_jinja_template` environment (5.23): `raise_exception(msg)`,
//! `strftime_now(fmt)` and the `tojson` filter, which transformers overrides to
//! `json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)`
//! (so `{"a": 1}`, with Python's default separators, not minijinja's compact `{"a":1}`).
//! String methods (`.strip()`, `.split()`, `dict.get()`, ...) come from `minijinja_contrib::pycompat`.
//! Known gap: floats print in Rust's shortest form (`1e20`), Python prints `1e+20`.

use minijinja::value::{Kwargs, Value};
use minijinja::{Error, ErrorKind};

/// `raise_exception(message)`: fails the render with the template's message, as transformers does.
pub fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the current UTC time formatted with a subset of C `strftime`
/// (`%Y %y %m %d %e %H %I %M %S %p %B %b %A %a %j %%`); other directives are an error.
pub fn strftime_now(format: String) -> Result<Value, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?
        .as_secs();
    strftime(secs, &format).map(Value::from)
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
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Formats Unix seconds (UTC). Civil-date conversion after Howard Hinnant's `civil_from_days`.
fn strftime(unix_secs: u64, format: &str) -> Result<String, Error> {
    let days = (unix_secs / 86_400) as i64;
    let sod = unix_secs % 86_400;
    let (hour, minute, second) = (sod / 3600, sod / 60 % 60, sod % 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(month - 1) as usize] + day + i64::from(leap && month > 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday (index 3)
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let d = chars.next().unwrap_or('%');
        let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };
        match d {
            'Y' => out += &year.to_string(),
            'y' => out += &format!("{:02}", year % 100),
            'm' => out += &format!("{month:02}"),
            'd' => out += &format!("{day:02}"),
            'e' => out += &format!("{day:2}"),
            'H' => out += &format!("{hour:02}"),
            'I' => out += &format!("{hour12:02}"),
            'M' => out += &format!("{minute:02}"),
            'S' => out += &format!("{second:02}"),
            'p' => out += if hour < 12 { "AM" } else { "PM" },
            'B' => out += MONTHS[(month - 1) as usize],
            'b' => out += &MONTHS[(month - 1) as usize][..3],
            'A' => out += DAYS[weekday],
            'a' => out += &DAYS[weekday][..3],
            'j' => out += &format!("{yday:03}"),
            '%' => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: unsupported directive %{other}"),
                ))
            }
        }
    }
    Ok(out)
}

/// The `tojson` filter with Python `json.dumps` output (`ensure_ascii=False`), supporting the
/// `indent`, `separators` and `sort_keys` keyword arguments transformers accepts.
pub fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?; // accepted; output is never ASCII-escaped
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators {
        Some(s) if s.len() == 2 => (s[0].clone(), s[1].clone()),
        Some(s) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: separators must have 2 items, got {}", s.len()),
            ))
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let style = Style {
        indent,
        sort_keys: sort_keys.unwrap_or(false),
        item_sep,
        key_sep,
    };
    let mut out = String::new();
    style.write(&json, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

struct Style {
    indent: Option<usize>,
    sort_keys: bool,
    item_sep: String,
    key_sep: String,
}

impl Style {
    fn newline(&self, level: usize, out: &mut String) {
        if let Some(n) = self.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * level));
        }
    }

    fn write(&self, v: &serde_json::Value, level: usize, out: &mut String) {
        use serde_json::Value as J;
        match v {
            J::Array(items) if !items.is_empty() => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(level + 1, out);
                    self.write(item, level + 1, out);
                }
                self.newline(level, out);
                out.push(']');
            }
            J::Object(map) if !map.is_empty() => {
                let mut entries: Vec<_> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, item)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(level + 1, out);
                    out.push_str(&serde_json::Value::String(k.clone()).to_string());
                    out.push_str(&self.key_sep);
                    self.write(item, level + 1, out);
                }
                self.newline(level, out);
                out.push('}');
            }
            J::Bool(true) => out.push_str("true"),
            J::Bool(false) => out.push_str("false"),
            other => out.push_str(&other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_known_date() {
        // 2024-03-01 13:05:09 UTC (a Friday, day 61 of a leap year)
        let t = 1_709_298_309;
        assert_eq!(
            strftime(t, "%Y-%m-%d %H:%M:%S %a %A %b %B %j %I%p %%").unwrap(),
            "2024-03-01 13:05:09 Fri Friday Mar March 061 01PM %"
        );
        assert!(strftime(t, "%Q").is_err());
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let env = minijinja::Environment::new();
        let mut env = env;
        env.add_filter("tojson", tojson);
        let render = |src: &str| {
            env.render_str(src, minijinja::context! { x => serde_json::json!({"b": [1, "é\n"], "a": true, "c": {}}) })
                .unwrap()
        };
        // Python: json.dumps({"b": [1, "é\n"], "a": True, "c": {}}, ensure_ascii=False, sort_keys=True)
        assert_eq!(
            render("{{ x | tojson(sort_keys=true) }}"),
            r#"{"a": true, "b": [1, "é\n"], "c": {}}"#
        );
        assert_eq!(
            render("{{ x | tojson(indent=2, sort_keys=true) }}"),
            "{\n  \"a\": true,\n  \"b\": [\n    1,\n    \"é\\n\"\n  ],\n  \"c\": {}\n}"
        );
    }
}
