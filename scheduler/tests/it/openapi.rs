//! The OpenAPI document against the code it is derived from: the committed copy
//! (`api/openapi.json`) is exactly what the server builds; every route of the table is
//! in the document and nothing else is; each operation names its route's scope and every
//! error it can answer with the one error body; every reference resolves and every named
//! schema is used; and `/openapi.json` is served without a key.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde_json::Value;

use agentq_scheduler::{
    Access, SECURITY_SCHEME, STREAM_EVENT, openapi_json, route_table, sse_events,
};

/// The committed copy.
fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../api/openapi.json")
}

fn document() -> Value {
    serde_json::from_str(&openapi_json()).unwrap()
}

/// The OpenAPI path of a route pattern (`{*path}` is `{path}`).
fn openapi_path(pattern: &str) -> String {
    pattern.replace("{*", "{")
}

/// Every operation: (method, path) → operation.
fn operations(doc: &Value) -> BTreeMap<(String, String), Value> {
    let mut ops = BTreeMap::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            ops.insert((method.to_uppercase(), path.clone()), op.clone());
        }
    }
    ops
}

#[test]
fn the_committed_copy_is_what_the_server_builds() {
    let built = openapi_json();
    let path = committed_path();
    if std::env::var_os("AGENTQ_UPDATE_OPENAPI").is_some_and(|v| v == "1") {
        std::fs::write(&path, &built).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed == built {
        return;
    }
    // Name the first difference: a route, a field or an answer that changed.
    let first = committed
        .lines()
        .zip(built.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| committed.lines().count().min(built.lines().count()));
    let show = |text: &str| {
        text.lines()
            .skip(first.saturating_sub(3))
            .take(7)
            .collect::<Vec<_>>()
            .join("\n")
    };
    panic!(
        "api/openapi.json differs from the document the server builds, from line {}:\n\
         --- committed\n{}\n--- built\n{}\n\
         If the change to the API is meant, rewrite the copy and commit it:\n  \
         AGENTQ_UPDATE_OPENAPI=1 cargo test -p agentq-scheduler --test it openapi",
        first + 1,
        show(&committed),
        show(&built)
    );
}

#[test]
fn every_route_is_described_and_nothing_else() {
    let doc = document();
    let ops = operations(&doc);
    let described: BTreeSet<(String, String)> = ops.keys().cloned().collect();
    let mut served: BTreeSet<(String, String)> = route_table()
        .into_iter()
        .map(|(m, p, _)| (m.to_string(), openapi_path(p)))
        .collect();
    // On the metrics listener, not in the API's table.
    served.insert(("GET".into(), "/metrics".into()));
    let undescribed: Vec<_> = served.difference(&described).collect();
    let unserved: Vec<_> = described.difference(&served).collect();
    assert!(
        undescribed.is_empty(),
        "routes without a description: {undescribed:?}"
    );
    assert!(
        unserved.is_empty(),
        "described but not served: {unserved:?}"
    );
    assert!(described.contains(&("GET".into(), "/openapi.json".into())));

    let mut ids = BTreeSet::new();
    for ((method, path), op) in &ops {
        let id = op["operationId"].as_str().unwrap();
        assert!(
            id.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
            "{method} {path}: operationId {id:?} is not snake_case"
        );
        assert!(ids.insert(id.to_string()), "operationId {id} twice");
        assert!(op["summary"].is_string(), "{method} {path} has no summary");
        assert!(op["tags"][0].is_string(), "{method} {path} has no tag");
    }
}

/// The statuses `op` answers.
fn statuses(op: &Value) -> BTreeSet<u16> {
    op["responses"]
        .as_object()
        .unwrap()
        .keys()
        .map(|s| s.parse().unwrap())
        .collect()
}

/// The schema of an answer (a shared one resolved) in `application/json`.
fn json_schema<'a>(doc: &'a Value, answer: &'a Value) -> &'a Value {
    let answer = match answer["$ref"].as_str() {
        Some(r) => {
            let name = r.strip_prefix("#/components/responses/").unwrap();
            &doc["components"]["responses"][name]
        }
        None => answer,
    };
    &answer["content"]["application/json"]["schema"]
}

#[test]
fn every_operation_names_its_scope_and_its_errors() {
    let doc = document();
    let ops = operations(&doc);
    let error_body = serde_json::json!({"$ref": "#/components/schemas/ErrorBody"});
    for (method, pattern, access) in route_table() {
        let path = openapi_path(pattern);
        let op = &ops[&(method.to_string(), path.clone())];
        let at = format!("{method} {path}");
        let security = &op["security"];
        match access {
            Access::Open => assert!(security.is_null(), "{at} is open: {security}"),
            Access::Scope(scope) => assert_eq!(
                security,
                &serde_json::json!([{SECURITY_SCHEME: [scope.as_str()]}]),
                "{at}"
            ),
            Access::Key => assert_eq!(
                security,
                &serde_json::json!([{SECURITY_SCHEME: []}]),
                "{at}"
            ),
        }
        let answers = statuses(op);
        let mut must: BTreeSet<u16> = [403, 408, 414, 431, 500, 503].into();
        if access != Access::Open {
            must.insert(401);
        }
        let params = op["parameters"].as_array().cloned().unwrap_or_default();
        let takes = |place: &str| params.iter().any(|p| p["in"] == place);
        if takes("path") {
            must.extend([404, 422]);
        }
        if takes("query") {
            must.extend([400, 422]);
        }
        if op["requestBody"]["content"]["application/json"].is_object() {
            must.extend([400, 413, 415, 422]);
        }
        let missing: Vec<_> = must.difference(&answers).collect();
        assert!(missing.is_empty(), "{at} does not describe {missing:?}");
        assert!(
            answers.iter().any(|s| (200..300).contains(s)),
            "{at} has no success"
        );
        for status in answers.iter().filter(|s| **s >= 400) {
            let answer = &op["responses"][status.to_string()];
            // `/mcp` refuses a message that is not JSON-RPC with a JSON-RPC error; a
            // route that is down says why in the answer it always gives (`/readyz`).
            let own = (path == "/mcp" && *status == 400) || (path == "/readyz" && *status == 503);
            if !own {
                assert_eq!(
                    json_schema(&doc, answer),
                    &error_body,
                    "{at} answers {status} without the error body"
                );
            }
        }
    }
}

#[test]
fn the_event_stream_names_every_event() {
    let doc = document();
    let content = &doc["paths"]["/v1/sessions/{id}/events"]["get"]["responses"]["200"]["content"]["text/event-stream"];
    let reference = format!("#/components/schemas/{STREAM_EVENT}");
    assert_eq!(content["schema"]["$ref"], reference.as_str());
    // Each event name, with the schema its `data` is described by.
    let mut described = BTreeMap::new();
    for kind in doc["components"]["schemas"][STREAM_EVENT]["oneOf"]
        .as_array()
        .unwrap()
    {
        let data = &kind["properties"]["data"];
        assert_eq!(data["contentMediaType"], "application/json");
        let Some(schema) = data["contentSchema"]["$ref"].as_str() else {
            // An unknown kind: a plain message.
            assert_eq!(
                kind["properties"]["event"]["enum"],
                serde_json::json!(["message"])
            );
            continue;
        };
        let schema = schema
            .strip_prefix("#/components/schemas/")
            .unwrap()
            .to_string();
        for name in kind["properties"]["event"]["enum"].as_array().unwrap() {
            let name = name.as_str().unwrap().to_string();
            assert!(
                described.insert(name.clone(), schema.clone()).is_none(),
                "{name} twice"
            );
        }
    }
    let expected: BTreeMap<String, String> = sse_events()
        .into_iter()
        .map(|(name, schema)| (name.to_string(), schema))
        .collect();
    assert_eq!(described, expected);
    for kind in agentq_core::protocol::EventKind::ALL {
        assert!(described.contains_key(kind.as_str()), "{}", kind.as_str());
    }
    assert_eq!(described["reset"], "ResetEvent");
    assert_eq!(described["session_completed"], "CompletionEvent");
    // Every event of the agent is a variant of the schema its stream events' data has.
    let variants = doc["components"]["schemas"]["AgentEvent"]["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            v["properties"]["type"]["enum"][0]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect::<BTreeSet<_>>();
    for kind in agentq_core::protocol::EventKind::ALL {
        assert!(variants.contains(kind.as_str()), "{}", kind.as_str());
    }
}

/// Every `$ref` in `v`.
fn refs(v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get("$ref") {
                out.insert(r.clone());
            }
            m.values().for_each(|v| refs(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
        _ => {}
    }
}

#[test]
fn every_reference_resolves_and_every_component_is_used() {
    let doc = document();
    let mut all = BTreeSet::new();
    refs(&doc, &mut all);
    let mut used = BTreeSet::new();
    for r in &all {
        let name = r.strip_prefix("#/components/").expect(r);
        let (kind, name) = name.split_once('/').unwrap();
        assert!(
            doc["components"][kind][name].is_object(),
            "{r} names nothing"
        );
        used.insert(format!("{kind}/{name}"));
    }
    // The union of the webhook bodies is named for clients (a verified delivery's type);
    // each delivery's own body is its event's schema.
    used.insert("schemas/WebhookPayload".to_string());
    for kind in ["schemas", "responses"] {
        for name in doc["components"][kind].as_object().unwrap().keys() {
            assert!(
                used.contains(&format!("{kind}/{name}")),
                "components/{kind}/{name} is used by nothing"
            );
        }
    }
    assert_eq!(doc["openapi"], "3.1.0");
}

/// Every `description` in `v`, with where it is.
fn descriptions(v: &Value, at: &str, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("description", Value::String(d)) => out.push((at.to_string(), d.clone())),
                    _ => descriptions(x, &format!("{at}/{k}"), out),
                }
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                descriptions(x, &format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// The descriptions come from the code's doc comments, written for Rust readers; a client's
/// reader cannot follow a link to a Rust item, so none may be left in the document.
#[test]
fn no_description_links_to_a_rust_item() {
    let mut all = Vec::new();
    descriptions(&document(), "", &mut all);
    assert!(all.len() > 50, "{}", all.len());
    let linked: Vec<_> = all.iter().filter(|(_, d)| d.contains("[`")).collect();
    assert!(linked.is_empty(), "Rust links in descriptions: {linked:#?}");
}

/// Every event the store can announce is in the document's `webhooks`, and nothing else:
/// each a POST with the Standard Webhooks headers and a body whose `type` is the event.
#[test]
fn every_webhook_event_is_described_as_its_delivery() {
    let doc = document();
    let described: BTreeSet<String> = doc["webhooks"]
        .as_object()
        .expect("the document has webhooks")
        .keys()
        .cloned()
        .collect();
    let emitted: BTreeSet<String> = agentq_core::webhook::WebhookEvent::ALL
        .iter()
        .map(|e| e.as_str().to_string())
        .collect();
    assert_eq!(described, emitted);
    let subscribable: BTreeSet<String> = agentq_api::WEBHOOK_EVENTS
        .iter()
        .map(|e| e.to_string())
        .collect();
    assert_eq!(subscribable, emitted);
    for event in &emitted {
        let op = &doc["webhooks"][event]["post"];
        let headers: BTreeSet<&str> = op["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["in"] == "header" && p["required"] == true)
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            headers,
            BTreeSet::from(["webhook-id", "webhook-timestamp", "webhook-signature"]),
            "{event}"
        );
        let body = &op["requestBody"]["content"]["application/json"]["schema"];
        let name = body["$ref"]
            .as_str()
            .unwrap()
            .trim_start_matches("#/components/schemas/");
        let schema = &doc["components"]["schemas"][name];
        assert_eq!(
            schema["properties"]["type"]["enum"],
            serde_json::json!([event])
        );
        // And the union of the bodies names it.
        assert!(
            doc["components"]["schemas"]["WebhookPayload"]["oneOf"]
                .as_array()
                .unwrap()
                .contains(body),
            "{event}"
        );
        let required: BTreeSet<&str> = schema["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_str().unwrap())
            .collect();
        assert_eq!(
            required,
            BTreeSet::from(["type", "timestamp", "data"]),
            "{event}"
        );
    }
}

/// Check `value` against the document's `schema` (the parts of JSON Schema the document
/// uses: `$ref`, `oneOf`/`anyOf`/`allOf`, `type`, `enum`, `properties`, `required`,
/// `items`). An object with `properties` holds no other key: a field sent but not
/// described is a difference too. The first difference, with where it is.
pub fn check_against(doc: &Value, schema: &Value, value: &Value) -> Result<(), String> {
    check_at(doc, schema, value, "$", true)
}

fn check_at(
    doc: &Value,
    schema: &Value,
    value: &Value,
    at: &str,
    strict: bool,
) -> Result<(), String> {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.trim_start_matches("#/components/schemas/");
        return check_at(doc, &doc["components"]["schemas"][name], value, at, strict);
    }
    if let Some(all) = schema["allOf"].as_array() {
        // Each part sees only its own fields; the union must cover the value's.
        for part in all {
            check_at(doc, part, value, at, false)?;
        }
        if strict && let Some(obj) = value.as_object() {
            let mut known = BTreeSet::new();
            for part in all {
                known.extend(property_names(doc, part));
            }
            if let Some(extra) = obj.keys().find(|k| !known.contains(k.as_str())) {
                return Err(format!("{at}.{extra}: not described"));
            }
        }
        return Ok(());
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(options) = schema[key].as_array() {
            let fits = options
                .iter()
                .filter(|o| check_at(doc, o, value, at, strict).is_ok())
                .count();
            let ok = if key == "oneOf" { fits == 1 } else { fits >= 1 };
            if !ok {
                return Err(format!("{at}: {fits} of the {key} options fit {value}"));
            }
            return Ok(());
        }
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(value)
    {
        return Err(format!("{at}: {value} is not one of {allowed:?}"));
    }
    let types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let kind = match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    if !types.is_empty()
        && !types
            .iter()
            .any(|t| *t == kind || (*t == "number" && kind == "integer"))
    {
        return Err(format!("{at}: a {kind} where the document says {types:?}"));
    }
    if let Value::Object(obj) = value {
        for r in schema["required"].as_array().into_iter().flatten() {
            let r = r.as_str().unwrap_or_default();
            if !obj.contains_key(r) {
                return Err(format!("{at}.{r}: required, not sent"));
            }
        }
        if let Some(props) = schema["properties"].as_object() {
            for (k, v) in obj {
                match props.get(k) {
                    Some(p) => check_at(doc, p, v, &format!("{at}.{k}"), true)?,
                    None if strict => return Err(format!("{at}.{k}: not described")),
                    None => {}
                }
            }
        }
    }
    if let (Value::Array(items), Some(item)) = (value, schema.get("items")) {
        for (i, v) in items.iter().enumerate() {
            check_at(doc, item, v, &format!("{at}[{i}]"), true)?;
        }
    }
    Ok(())
}

fn property_names(doc: &Value, schema: &Value) -> BTreeSet<String> {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.trim_start_matches("#/components/schemas/");
        return property_names(doc, &doc["components"]["schemas"][name]);
    }
    let mut names: BTreeSet<String> = schema["properties"]
        .as_object()
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    for part in schema["allOf"].as_array().into_iter().flatten() {
        names.extend(property_names(doc, part));
    }
    names
}

/// `body`, a delivery as received, is what the document's `webhooks` says of its `type`.
pub fn assert_delivery_described(body: &Value) {
    let doc = document();
    let event = body["type"].as_str().unwrap_or_default();
    let schema =
        &doc["webhooks"][event]["post"]["requestBody"]["content"]["application/json"]["schema"];
    assert!(
        schema.is_object(),
        "no webhook `{event}` in the document: {body}"
    );
    if let Err(e) = check_against(&doc, schema, body) {
        panic!("the `{event}` delivery differs from the document: {e}\n{body}");
    }
}

/// The checker refuses what differs: a field not described, a missing one, a wrong type.
#[test]
fn the_delivery_checker_sees_differences() {
    let good = serde_json::to_value(agentq_api::WebhookPayload::BatchCompleted {
        timestamp: chrono::Utc::now(),
        data: agentq_api::BatchChange {
            batch_id: "b1".into(),
        },
    })
    .unwrap();
    assert_delivery_described(&good);
    let doc = document();
    let schema = &doc["webhooks"]["batch.completed"]["post"]["requestBody"]["content"]["application/json"]
        ["schema"];
    let mut extra = good.clone();
    extra["data"]["count"] = 1.into();
    assert!(check_against(&doc, schema, &extra).is_err());
    let mut missing = good.clone();
    missing["data"].as_object_mut().unwrap().remove("batch_id");
    assert!(check_against(&doc, schema, &missing).is_err());
    let mut wrong = good.clone();
    wrong["type"] = "session.completed".into();
    assert!(check_against(&doc, schema, &wrong).is_err());
    wrong = good;
    wrong["data"]["batch_id"] = 7.into();
    assert!(check_against(&doc, schema, &wrong).is_err());
}
