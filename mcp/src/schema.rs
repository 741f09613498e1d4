//! Holding a call's arguments to the input schema its server published, before the call:
//! a mismatch is a tool error the model sees and can correct, and the server is never
//! asked. A documented subset of JSON Schema, the part tool schemas use: `type` (one or a
//! list), `enum`, `const`, `properties`, `required`, `additionalProperties` (a boolean or a
//! schema), `items` (one schema), `minItems`/`maxItems`, `minLength`/`maxLength`,
//! `minimum`/`maximum`/`exclusiveMinimum`/`exclusiveMaximum` (numbers), `anyOf`, `oneOf`
//! and `allOf`. Anything else (`$ref`, `pattern`, `format`…) is not checked: the server
//! remains the judge of what it accepts, this only spares it (and the model) calls that
//! cannot be right. The check is bounded in depth and in work ([`MAX_STEPS`]): past the
//! bound it gives up and the server judges.

use serde_json::{Map, Value};

/// Deeper schemas are not followed further: a server cannot make the check recurse
/// without bound.
const MAX_DEPTH: usize = 32;
/// Most (value, schema) pairs one check visits. The work is the schema's size times the
/// arguments' (each array item against `items`, each branch of `anyOf`): a server's wide
/// schema and a model's long arguments together could otherwise hold a worker's thread
/// for seconds. Past it the check gives up and the server judges, as for what the
/// subset does not check.
pub const MAX_STEPS: usize = 100_000;

/// The visits left to a check; once spent, every part of it passes.
struct Budget {
    left: usize,
}

impl Budget {
    /// Take one visit; `false` once none is left.
    fn take(&mut self) -> bool {
        match self.left.checked_sub(1) {
            Some(n) => {
                self.left = n;
                true
            }
            None => false,
        }
    }

    fn spent(&self) -> bool {
        self.left == 0
    }
}

/// Why `args` does not fit `schema`, naming the path of the first misfit (`arguments`,
/// `arguments.city`, `arguments.tags[2]`).
pub fn check(args: &Value, schema: &Map<String, Value>) -> Result<(), String> {
    let mut b = Budget { left: MAX_STEPS };
    let r = check_at(args, schema, "arguments", 0, &mut b);
    // A verdict reached after the budget ran out may rest on parts that passed unchecked.
    if b.spent() { Ok(()) } else { r }
}

fn check_at(
    v: &Value,
    s: &Map<String, Value>,
    at: &str,
    depth: usize,
    b: &mut Budget,
) -> Result<(), String> {
    if depth > MAX_DEPTH || !b.take() {
        return Ok(());
    }
    if let Some(t) = s.get("type") {
        check_type(v, t, at)?;
    }
    if let Some(Value::Array(allowed)) = s.get("enum")
        && !allowed.contains(v)
    {
        return Err(format!(
            "{at} must be one of {}",
            Value::Array(allowed.clone())
        ));
    }
    if let Some(c) = s.get("const")
        && c != v
    {
        return Err(format!("{at} must be {c}"));
    }
    match v {
        Value::Object(o) => check_object(o, s, at, depth, b)?,
        Value::Array(a) => check_array(a, s, at, depth, b)?,
        Value::String(text) => {
            let n = text.chars().count() as u64;
            if let Some(min) = s.get("minLength").and_then(Value::as_u64)
                && n < min
            {
                return Err(format!("{at} must be at least {min} characters"));
            }
            if let Some(max) = s.get("maxLength").and_then(Value::as_u64)
                && n > max
            {
                return Err(format!("{at} must be at most {max} characters"));
            }
        }
        Value::Number(n) => check_number(n.as_f64().unwrap_or(f64::NAN), s, at)?,
        Value::Bool(_) | Value::Null => {}
    }
    check_combinators(v, s, at, depth, b)
}

fn check_type(v: &Value, t: &Value, at: &str) -> Result<(), String> {
    let fits = |name: &str| match name {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "number" => v.is_number(),
        "integer" => v.as_i64().is_some() || v.as_u64().is_some() || is_whole(v),
        // A type this subset does not know is not held against the value.
        _ => true,
    };
    let ok = match t {
        Value::String(name) => fits(name),
        Value::Array(names) => names.iter().filter_map(Value::as_str).any(fits),
        _ => true,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{at} must be of type {t}, not {}", kind(v)))
    }
}

/// `1.0` is an integer to JSON Schema.
fn is_whole(v: &Value) -> bool {
    v.as_f64()
        .is_some_and(|f| f.is_finite() && f.fract() == 0.0)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Object(_) => "object",
        Value::Array(_) => "array",
        Value::String(_) => "string",
        Value::Bool(_) => "boolean",
        Value::Null => "null",
        Value::Number(_) => "number",
    }
}

fn check_object(
    o: &Map<String, Value>,
    s: &Map<String, Value>,
    at: &str,
    depth: usize,
    b: &mut Budget,
) -> Result<(), String> {
    if let Some(Value::Array(required)) = s.get("required") {
        for name in required.iter().filter_map(Value::as_str) {
            if !o.contains_key(name) {
                return Err(format!("{at}.{name} is required"));
            }
        }
    }
    let props = s.get("properties").and_then(Value::as_object);
    for (k, val) in o {
        let path = format!("{at}.{k}");
        match props.and_then(|p| p.get(k)) {
            Some(Value::Object(ps)) => check_at(val, ps, &path, depth + 1, b)?,
            Some(_) => {}
            None => match s.get("additionalProperties") {
                Some(Value::Bool(false)) => {
                    return Err(format!("{path} is not a known argument"));
                }
                Some(Value::Object(extra)) => check_at(val, extra, &path, depth + 1, b)?,
                _ => {}
            },
        }
    }
    Ok(())
}

fn check_array(
    a: &[Value],
    s: &Map<String, Value>,
    at: &str,
    depth: usize,
    b: &mut Budget,
) -> Result<(), String> {
    let n = a.len() as u64;
    if let Some(min) = s.get("minItems").and_then(Value::as_u64)
        && n < min
    {
        return Err(format!("{at} must hold at least {min} items"));
    }
    if let Some(max) = s.get("maxItems").and_then(Value::as_u64)
        && n > max
    {
        return Err(format!("{at} must hold at most {max} items"));
    }
    if let Some(Value::Object(items)) = s.get("items") {
        for (i, item) in a.iter().enumerate() {
            if b.spent() {
                break;
            }
            check_at(item, items, &format!("{at}[{i}]"), depth + 1, b)?;
        }
    }
    Ok(())
}

fn check_number(n: f64, s: &Map<String, Value>, at: &str) -> Result<(), String> {
    let bound = |key: &str| s.get(key).and_then(Value::as_f64);
    if let Some(min) = bound("minimum")
        && n < min
    {
        return Err(format!("{at} must be at least {min}"));
    }
    if let Some(max) = bound("maximum")
        && n > max
    {
        return Err(format!("{at} must be at most {max}"));
    }
    if let Some(min) = bound("exclusiveMinimum")
        && n <= min
    {
        return Err(format!("{at} must be more than {min}"));
    }
    if let Some(max) = bound("exclusiveMaximum")
        && n >= max
    {
        return Err(format!("{at} must be less than {max}"));
    }
    Ok(())
}

fn check_combinators(
    v: &Value,
    s: &Map<String, Value>,
    at: &str,
    depth: usize,
    b: &mut Budget,
) -> Result<(), String> {
    let schemas = |key: &str| -> Vec<&Map<String, Value>> {
        s.get(key)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_object).collect())
            .unwrap_or_default()
    };
    for sub in schemas("allOf") {
        check_at(v, sub, at, depth + 1, b)?;
    }
    let any = schemas("anyOf");
    if !any.is_empty()
        && !any
            .iter()
            .any(|sub| check_at(v, sub, at, depth + 1, b).is_ok())
    {
        return Err(format!("{at} fits none of the allowed shapes (anyOf)"));
    }
    let one = schemas("oneOf");
    if !one.is_empty() {
        let fits = one
            .iter()
            .filter(|sub| check_at(v, sub, at, depth + 1, b).is_ok())
            .count();
        if fits != 1 {
            return Err(format!(
                "{at} must fit exactly one of the allowed shapes (oneOf), fits {fits}"
            ));
        }
    }
    Ok(())
}
