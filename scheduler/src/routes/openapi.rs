//! `GET /openapi.json`: the API's OpenAPI 3.1 document, derived from the route table and
//! the `agentq-api` types, built once per process and served to anyone (like `/healthz`:
//! it holds nothing a client could not read in the repository).
//!
//! Each operation is what the `#[utoipa::path]` of its handler states (its success
//! answers, the errors particular to it, its parameters and body), completed here from
//! its entry of the table, so that what every route shares is said once:
//! - its scope, as the security requirement `api_key: [<scope>]`: OpenAPI 3.1 lets a
//!   requirement of any scheme list the role names an operation needs, which is what a
//!   scope is; a made-up OAuth flow would describe a token exchange that does not exist.
//!   `/mcp` takes any valid key (each tool checks its own scope): `api_key: []`.
//! - the errors every route of its kind can answer (a keyed route: 401; a JSON body: 400,
//!   413, 415, 422; a path or query parameter: 404 or 400, and 422; every route: 403,
//!   408, 414, 431, 500, 503), each the one error body, as a shared response.
//! - links from the answer of `POST /v1/sessions` (`POST /v1/batches`) to every operation
//!   on the session (batch) it names (`{id}` is its `id`), for clients and for a fuzzer
//!   that follows them.
//! - the events of an SSE answer: in OpenAPI 3.1 the `schema` of `text/event-stream`
//!   describes one event as a reader parses it (`event`, `id`, `data`); each kind of
//!   event (from [`EventKind::ALL`]) names the schema of its `data` with JSON Schema's
//!   `contentMediaType` and `contentSchema`.
//!
//! The committed copy (`api/openapi.json`) is the test fixture: `scheduler/tests/it/openapi.rs`
//! regenerates it and fails on any difference.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use axum::body::Bytes;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use utoipa::openapi::link::LinkBuilder;
use utoipa::openapi::path::{Operation, OperationBuilder, ParameterBuilder, ParameterIn, Paths};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::schema::{Components, OneOfBuilder, Schema, Type};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{
    ContentBuilder, HeaderBuilder, HttpMethod, InfoBuilder, ObjectBuilder, OpenApi, OpenApiBuilder,
    Ref, RefOr, Required, ResponseBuilder, Tag,
};
use utoipa::{PartialSchema, ToSchema};

use agentq_api as api;
use agentq_core::protocol::EventKind;

use super::{Route, metrics_table, table};
use crate::http::auth::Access;

/// The security scheme every keyed operation names.
pub const SECURITY_SCHEME: &str = "api_key";

/// The document, as served: built on first use, then the same bytes for every request.
static DOCUMENT: LazyLock<Bytes> = LazyLock::new(|| Bytes::from(document_json()));

/// `GET /openapi.json`
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "get_openapi",
    summary = "This document",
    description = "The OpenAPI 3.1 description of this API, built from the server's own route \
        table and types.",
    responses((status = 200, description = "The document", content_type = "application/json",
        body = Object)),
)]
pub(super) async fn serve() -> Response {
    ([(CONTENT_TYPE, "application/json")], DOCUMENT.clone()).into_response()
}

/// The document as JSON text: objects with their keys sorted, indented, ending in a new
/// line (the form of the committed copy).
pub fn document_json() -> String {
    // Through a `Value`: its maps are sorted, where the document holds hash maps.
    let value = serde_json::to_value(document()).unwrap_or_else(|e| {
        tracing::error!(error = %e, "cannot encode the OpenAPI document");
        Value::Null
    });
    let mut text = serde_json::to_string_pretty(&value).unwrap_or_default();
    text.push('\n');
    text
}

/// The OpenAPI document of the API.
pub fn document() -> OpenApi {
    let mut paths = Paths::new();
    for r in table().iter().chain(&metrics_table()) {
        paths.add_path_operation((r.doc.path)(), (r.doc.methods)(), operation(r));
    }
    link_created(&mut paths);
    let mut components = Components::new();
    components.schemas = schemas();
    components.responses = errors::responses();
    components.security_schemes = BTreeMap::from([(
        SECURITY_SCHEME.to_string(),
        RefOr::T(SecurityScheme::Http(
            Http::builder()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some(
                    "`Authorization: Bearer <key>`, a key from `agentq keys create` (or the \
                     operator's `AGENTQ_ADMIN_KEY`). Each operation names the scope its key \
                     must hold; a key with `admin` holds them all. `agentq dev` on a loopback \
                     address runs without keys unless `AGENTQ_ADMIN_KEY` is set.",
                ))
                .build(),
        )),
    )]);
    OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("agentq")
                .version(env!("CARGO_PKG_VERSION"))
                .description(Some(
                    "LLM agent sessions as durable background jobs. Every error is the same \
                     body, `{\"error\": {\"code\", \"message\", \"field\"}}`, with `field` \
                     naming the value to blame.",
                ))
                .build(),
        )
        .paths(paths)
        .webhooks(Some(webhooks()))
        .components(Some(components))
        .tags(Some(TAGS.iter().map(|(name, description)| {
            let mut tag = Tag::new(*name);
            tag.description = Some((*description).to_string());
            tag
        })))
        .build()
}

/// The tags of the document, in order ([`tag_of`] gives an operation its own).
const TAGS: &[(&str, &str)] = &[
    (
        "sessions",
        "Sessions: create, read, steer, cancel, retry, approve, and their files and events.",
    ),
    (
        "batches",
        "Batches as objects: submit (JSON or JSON Lines), read, list, cancel, results.",
    ),
    (
        "webhooks",
        "Signed webhooks: endpoints, their secrets, deliveries and dead letters (the \
         `webhooks` scope).",
    ),
    (
        "schedules",
        "Schedules: sessions started by cron in a time zone or by interval, their overlap \
         policy, pause, resume, trigger and the history of fires.",
    ),
    ("queues", "The queues sessions may name."),
    (
        "admin",
        "Budgets, spend and the rate limiter (the `admin` scope).",
    ),
    ("mcp", "The session routes as MCP tools."),
    (
        "console",
        "The browser console's page and files (it reads everything through this API).",
    ),
    ("service", "Health, readiness, metrics and this document."),
];

fn tag_of(path: &str) -> &'static str {
    // The held calls across sessions belong with the sessions' own approvals.
    if path.starts_with("/v1/sessions") || path == "/v1/approvals" {
        "sessions"
    } else if path.starts_with("/v1/batches") {
        "batches"
    } else if path.starts_with("/v1/webhooks") {
        "webhooks"
    } else if path.starts_with("/v1/schedules") {
        "schedules"
    } else if path.starts_with("/v1/queues") {
        "queues"
    } else if path.starts_with("/v1/admin") {
        "admin"
    } else if path == "/mcp" {
        "mcp"
    } else if path.starts_with("/console") {
        "console"
    } else {
        "service"
    }
}

/// The operation of `r`: its handler's, with its tag, its scope and the errors every
/// route of its kind can answer.
fn operation(r: &Route) -> Operation {
    let mut op = (r.doc.operation)();
    op.tags = Some(vec![tag_of(r.path).to_string()]);
    op.security = match r.access {
        Access::Open => None,
        Access::Scope(scope) => Some(vec![SecurityRequirement::new(
            SECURITY_SCHEME,
            [scope.as_str()],
        )]),
        Access::Key => Some(vec![SecurityRequirement::new(
            SECURITY_SCHEME,
            Vec::<String>::new(),
        )]),
    };
    for status in errors::of(r.access, &op) {
        op.responses
            .responses
            .entry(status.to_string())
            .or_insert_with(|| RefOr::Ref(Ref::from_response_name(errors::name(status))));
    }
    describe_events(&mut op);
    op
}

/// The paths of the `POST`s that create a session and a batch, and the path prefix of the
/// operations on what each created: its answers name the object (`id`) they take.
const CREATED: &[(&str, &str)] = &[
    ("/v1/sessions", "/v1/sessions/{id}"),
    ("/v1/batches", "/v1/batches/{id}"),
    ("/v1/webhooks", "/v1/webhooks/{id}"),
    ("/v1/schedules", "/v1/schedules/{id}"),
];

/// Link each answer of a [`CREATED`] creation to the operations on what it created.
fn link_created(paths: &mut Paths) {
    for (create, on) in CREATED {
        link_created_at(paths, create, on);
    }
}

fn link_created_at(paths: &mut Paths, create: &str, on: &str) {
    let mut targets = Vec::new();
    for (path, item) in &paths.paths {
        if !path.starts_with(on) {
            continue;
        }
        let ops = [&item.get, &item.post, &item.put];
        for op in ops.into_iter().flatten() {
            if let Some(id) = &op.operation_id {
                targets.push(id.clone());
            }
        }
    }
    let Some(create) = paths
        .paths
        .get_mut(create)
        .and_then(|item| item.post.as_mut())
    else {
        return;
    };
    for (status, answer) in create.responses.responses.iter_mut() {
        let RefOr::T(answer) = answer else { continue };
        if !status.starts_with('2') {
            continue;
        }
        for target in &targets {
            let link = LinkBuilder::new()
                .operation_id(target.clone())
                .parameter("id", "$response.body#/id")
                .build();
            answer.links.insert(target.clone(), RefOr::T(link));
        }
    }
}

/// The SSE event names and the schema of each one's `data`.
pub fn sse_events() -> BTreeMap<&'static str, String> {
    let mut events: BTreeMap<&'static str, String> = EventKind::ALL
        .into_iter()
        .map(|k| {
            let schema = match k {
                EventKind::SessionCompleted => api::CompletionEvent::name(),
                _ => api::SessionEvent::name(),
            };
            (k.as_str(), schema.into_owned())
        })
        .collect();
    events.insert(api::events::RESET, api::ResetEvent::name().into_owned());
    events
}

/// The named schema of one event of a stream.
pub const STREAM_EVENT: &str = "StreamEvent";

/// One server-sent event, as a reader parses it (`event`, `id`, `data`): for each kind
/// of event, its `event:` names and the schema of its `data`, JSON text.
fn stream_event() -> RefOr<Schema> {
    let mut by_schema: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (name, schema) in sse_events() {
        by_schema.entry(schema).or_default().push(name);
    }
    let text = || ObjectBuilder::new().schema_type(Type::String);
    let json_text = || text().content_media_type("application/json");
    let mut kinds = OneOfBuilder::new().description(Some(
        "One event of the stream: `event` names its kind, `data` is its JSON. `id` (every \
         event but `reset`) resumes the stream after it as `Last-Event-ID`.",
    ));
    for (schema, names) in by_schema {
        let mut kind = ObjectBuilder::new()
            .schema_type(Type::Object)
            .property("event", text().enum_values(Some(names)))
            .required("event")
            .property(
                "data",
                json_text().content_schema(Some(Ref::from_schema_name(schema.clone()))),
            )
            .required("data");
        if schema != api::ResetEvent::name() {
            kind = kind.property("id", text());
        }
        kinds = kinds.item(kind);
    }
    // A kind of a newer worker that this server does not know goes out as a plain
    // message (no `event:` line, which a reader takes as `message`), its JSON as stored.
    let unknown = ObjectBuilder::new()
        .schema_type(Type::Object)
        .property("type", text())
        .required("type")
        .property("seq", ObjectBuilder::new().schema_type(Type::Integer))
        .required("seq");
    kinds = kinds.item(
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .property("event", text().enum_values(Some(["message"])))
            .property("data", json_text().content_schema(Some(unknown)))
            .required("data")
            .property("id", text()),
    );
    kinds.into()
}

/// Every `text/event-stream` answer of `op` is a stream of [`STREAM_EVENT`]s: in OpenAPI
/// 3.1 the `schema` of an event stream describes each event.
fn describe_events(op: &mut Operation) {
    for answer in op.responses.responses.values_mut() {
        let RefOr::T(answer) = answer else { continue };
        if let Some(RefOr::T(content)) = answer.content.get_mut("text/event-stream") {
            content.schema = Some(RefOr::Ref(Ref::from_schema_name(STREAM_EVENT)));
        }
    }
}

/// The headers of every delivery (the Standard Webhooks specification's), and what each
/// holds.
pub const WEBHOOK_HEADERS: &[(&str, &str)] = &[
    (
        "webhook-id",
        "The delivery's id: the same at every attempt, so a receiver drops a repeat by it.",
    ),
    (
        "webhook-timestamp",
        "When this attempt was signed, in seconds since the Unix epoch: refuse one too far \
         from your clock (five minutes is usual), so a captured delivery cannot be replayed \
         later.",
    ),
    (
        "webhook-signature",
        "`v1,<base64 HMAC-SHA256 of \"{webhook-id}.{webhook-timestamp}.{body}\">`, keyed \
         with the endpoint's secret (the base64 after `whsec_`); during a rotation's overlap \
         one per secret in force, separated by spaces: accept the delivery when any matches.",
    ),
];

/// The document's `webhooks`: for each event an endpoint can subscribe to, the POST that
/// delivers it, its body the [`api::WebhookPayload`] variant of the event (taken from the
/// type's own schema, so the document says what is serialized).
pub fn webhooks() -> Paths {
    let mut paths = Paths::new();
    for event in webhook_bodies().into_keys() {
        let body = Ref::from_schema_name(webhook_schema_name(&event));
        let mut op = OperationBuilder::new()
            .operation_id(Some(format!("webhook_{}", event.replace('.', "_"))))
            .summary(Some(format!("The `{event}` delivery")))
            .description(Some(
                "A POST to each enabled endpoint subscribed to the event, signed as the \
                 Standard Webhooks specification says (see `docs/webhooks.md`). An answer \
                 of 2xx within the timeout delivers it; anything else is retried with \
                 backoff, with the same `webhook-id`, then dead-lettered.",
            ))
            .tag(tag_of("/v1/webhooks"))
            .request_body(Some(
                RequestBodyBuilder::new()
                    .required(Some(Required::True))
                    .content(
                        "application/json",
                        ContentBuilder::new().schema(Some(body)).build(),
                    )
                    .build(),
            ))
            .response(
                "2XX",
                ResponseBuilder::new().description("Delivered: no retry follows."),
            )
            .response(
                "default",
                ResponseBuilder::new().description(
                    "Any other answer, or none within the timeout: retried with backoff.",
                ),
            );
        for (name, description) in WEBHOOK_HEADERS {
            op = op.parameter(
                ParameterBuilder::new()
                    .name(*name)
                    .parameter_in(ParameterIn::Header)
                    .required(Required::True)
                    .description(Some(*description))
                    .schema(Some(ObjectBuilder::new().schema_type(Type::String))),
            );
        }
        paths.add_path_operation(event, vec![HttpMethod::Post], op.build());
    }
    paths
}

/// The named schema of `event`'s body: `session.completed` → `WebhookSessionCompleted`.
pub fn webhook_schema_name(event: &str) -> String {
    let mut name = String::from("Webhook");
    for part in event.split(['.', '_']) {
        let mut chars = part.chars();
        if let Some(first) = chars.next() {
            name.extend(first.to_uppercase());
            name.push_str(chars.as_str());
        }
    }
    name
}

/// [`api::WebhookPayload`] as named schemas: each event's body (what its entry of
/// `webhooks` names), the payload as one of them, and the types they are made of.
fn webhook_schemas(all: &mut Vec<(String, RefOr<Schema>)>) {
    <api::WebhookPayload as ToSchema>::schemas(all);
    let mut payload = OneOfBuilder::new().description(Some(
        "The body of a delivery: `type` names the event, `data` is that event's shape (see \
         the document's `webhooks`).",
    ));
    for (event, body) in webhook_bodies() {
        let name = webhook_schema_name(&event);
        payload = payload.item(Ref::from_schema_name(name.clone()));
        all.push((name, body));
    }
    all.push((api::WebhookPayload::name().into_owned(), payload.into()));
}

/// Each event with the schema of its body: the variants of [`api::WebhookPayload`]'s
/// schema, keyed by the one value of their `type`.
pub fn webhook_bodies() -> BTreeMap<String, RefOr<Schema>> {
    let mut bodies = BTreeMap::new();
    let RefOr::T(Schema::OneOf(variants)) = <api::WebhookPayload as PartialSchema>::schema() else {
        return bodies;
    };
    for variant in variants.items {
        let RefOr::T(Schema::Object(object)) = &variant else {
            continue;
        };
        let event = match object.properties.get("type") {
            Some(RefOr::T(Schema::Object(kind))) => kind
                .enum_values
                .as_ref()
                .and_then(|v| v.first())
                .and_then(|v| v.as_str())
                .map(str::to_string),
            _ => None,
        };
        if let Some(event) = event {
            bodies.insert(event, variant);
        }
    }
    bodies
}

/// Every named schema: each type of `agentq-api` an operation names, with the types
/// they are made of.
fn schemas() -> BTreeMap<String, RefOr<Schema>> {
    let mut all = Vec::new();
    fn add<T: ToSchema>(all: &mut Vec<(String, RefOr<Schema>)>) {
        all.push((T::name().into_owned(), T::schema()));
        T::schemas(all);
    }
    add::<api::CreateSession>(&mut all);
    add::<api::SessionRef>(&mut all);
    add::<api::BatchResponse>(&mut all);
    add::<api::ListResponse>(&mut all);
    add::<api::SessionDetail>(&mut all);
    add::<api::TreeNode>(&mut all);
    add::<api::MessagesResponse>(&mut all);
    add::<api::CancelResponse>(&mut all);
    add::<api::RetryResponse>(&mut all);
    add::<api::ForkRequest>(&mut all);
    add::<api::ForkResponse>(&mut all);
    add::<api::SessionFilter>(&mut all);
    add::<api::BulkCancelResponse>(&mut all);
    add::<api::BulkRetryResponse>(&mut all);
    add::<api::PostMessage>(&mut all);
    add::<api::PostMessageResponse>(&mut all);
    add::<api::ApprovalRequest>(&mut all);
    add::<api::ApprovalResponse>(&mut all);
    add::<api::ApprovalList>(&mut all);
    add::<agentq_agent::spec::ExitReason>(&mut all);
    add::<agentq_core::wait::WaitReason>(&mut all);
    add::<api::CreateBatch>(&mut all);
    add::<api::BatchRequestItem>(&mut all);
    add::<api::BatchView>(&mut all);
    add::<api::BatchList>(&mut all);
    add::<api::BatchResult>(&mut all);
    add::<api::FileList>(&mut all);
    add::<api::CreateWebhook>(&mut all);
    add::<api::WebhookView>(&mut all);
    add::<api::WebhookList>(&mut all);
    add::<api::RotateWebhook>(&mut all);
    add::<api::DeliveryList>(&mut all);
    add::<api::Redriven>(&mut all);
    add::<api::CreateSchedule>(&mut all);
    add::<api::ScheduleView>(&mut all);
    add::<api::ScheduleList>(&mut all);
    add::<api::FireView>(&mut all);
    add::<api::FireList>(&mut all);
    webhook_schemas(&mut all);
    add::<api::QueueList>(&mut all);
    add::<api::CreateQueue>(&mut all);
    add::<api::QueueCreated>(&mut all);
    add::<api::BudgetList>(&mut all);
    add::<api::SetBudget>(&mut all);
    add::<api::BudgetSet>(&mut all);
    add::<api::TenantSpend>(&mut all);
    add::<api::SetRetention>(&mut all);
    add::<api::RetentionRuleView>(&mut all);
    add::<api::RetentionRules>(&mut all);
    add::<api::LimitsView>(&mut all);
    add::<api::SessionCounts>(&mut all);
    add::<api::CostReport>(&mut all);
    add::<api::Operations>(&mut all);
    add::<api::Readiness>(&mut all);
    add::<api::ErrorBody>(&mut all);
    add::<api::SessionEvent>(&mut all);
    add::<api::ResetEvent>(&mut all);
    add::<api::CompletionEvent>(&mut all);
    add::<agentq_core::SessionStatus>(&mut all);
    all.push((STREAM_EVENT.to_string(), stream_event()));
    all.into_iter().collect()
}

/// The answers every route of a kind can give, each the one error body.
mod errors {
    use super::*;

    /// (status, the name of its shared response, what it means here)
    const SHARED: &[(u16, &str, &str)] = &[
        (
            400,
            "BadRequest",
            "`invalid_json`: the body (or the line of an upload named by `field`) is not \
             JSON; `invalid_query`: the query string cannot be decoded.",
        ),
        (
            401,
            "Unauthorized",
            "`unauthorized`: no key, or one that is unknown, expired or revoked.",
        ),
        (
            403,
            "Forbidden",
            "`forbidden`: the key lacks the operation's scope; or, on a keyless `agentq dev`, \
             a `Host` that is not a loopback name, or a write that is not JSON (or JSON \
             Lines) or comes from a page of another origin (`field`: `Host`, `Content-Type` \
             or `Origin`).",
        ),
        (
            404,
            "NotFound",
            "`not_found`: nothing of this key's tenant by that name (another tenant's session \
             is answered the same).",
        ),
        (
            408,
            "RequestTimeout",
            "`timeout`: the request was not sent within the server's time.",
        ),
        (
            413,
            "TooLarge",
            "`too_large`: the body, or the field named, is larger than allowed.",
        ),
        (
            414,
            "UriTooLong",
            "`uri_too_long`: the request line is longer than the server reads.",
        ),
        (
            415,
            "UnsupportedMediaType",
            "`unsupported_media_type`: the body is not sent as `application/json` (nor, \
             where an operation takes it, `application/x-ndjson`).",
        ),
        (
            422,
            "Invalid",
            "A value the API does not take, named by `field`: `invalid_field`, \
             `unknown_field` (a field or query parameter the operation does not read), \
             `credential_not_allowed`, `invalid_body`, `invalid_value`, …",
        ),
        (
            431,
            "HeadersTooLarge",
            "`headers_too_large`: the request's headers are larger than the server reads.",
        ),
        (
            500,
            "Internal",
            "`internal`: the cause is logged, not sent.",
        ),
        (
            503,
            "Unavailable",
            "`unavailable`: a backend is unreachable now; `overloaded`: a cap of the server \
             (connections, event streams) is reached. Retry after `Retry-After` seconds.",
        ),
    ];

    /// The shared response of `status`.
    pub(super) fn name(status: u16) -> &'static str {
        SHARED
            .iter()
            .find(|(s, _, _)| *s == status)
            .map_or("Internal", |(_, name, _)| name)
    }

    /// The statuses every operation like `op` with `access` can answer.
    pub(super) fn of(access: Access, op: &Operation) -> Vec<u16> {
        let mut statuses = vec![403, 408, 414, 431, 500, 503];
        if access != Access::Open {
            statuses.push(401);
        }
        let json_body = op.request_body.as_ref().is_some_and(
            |b| matches!(b, RefOr::T(b) if b.content.contains_key("application/json")),
        );
        if json_body {
            statuses.extend([400, 413, 415, 422]);
        }
        let params = op.parameters.iter().flatten();
        let mut path = false;
        let mut query = false;
        let mut header = false;
        for p in params {
            if let RefOr::T(p) = p {
                use utoipa::openapi::path::ParameterIn;
                match p.parameter_in {
                    ParameterIn::Path => path = true,
                    ParameterIn::Query => query = true,
                    ParameterIn::Header => header = true,
                    _ => {}
                }
            }
        }
        if path {
            statuses.extend([404, 422]);
        }
        if query {
            statuses.extend([400, 422]);
        }
        if header {
            statuses.push(422);
        }
        statuses.sort_unstable();
        statuses.dedup();
        statuses
    }

    /// The shared responses, by name.
    pub(super) fn responses() -> BTreeMap<String, RefOr<utoipa::openapi::Response>> {
        SHARED
            .iter()
            .map(|(status, name, description)| {
                let mut answer = ResponseBuilder::new().description(*description).content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name(api::ErrorBody::name())))
                        .build(),
                );
                let integer = || ObjectBuilder::new().schema_type(Type::Integer);
                let text = || ObjectBuilder::new().schema_type(Type::String);
                if *status == 401 {
                    answer = answer.header(
                        "WWW-Authenticate",
                        HeaderBuilder::new()
                            .schema(Some(text()))
                            .description(Some("`Bearer`"))
                            .build(),
                    );
                }
                if *status == 503 {
                    answer = answer.header(
                        "Retry-After",
                        HeaderBuilder::new()
                            .schema(Some(integer()))
                            .description(Some("Seconds to wait before trying again."))
                            .build(),
                    );
                }
                (name.to_string(), RefOr::T(answer.build()))
            })
            .collect()
    }
}
