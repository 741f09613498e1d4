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
