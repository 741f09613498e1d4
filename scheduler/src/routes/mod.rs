//! The HTTP API's routes. Each module serves one part of the API and imports only the
//! shared helpers of [`crate::http`], never another route module.
//!
//! [`table`] is every route with what it requires and its OpenAPI operation (the
//! `#[utoipa::path]` of its handler); the router is built from it, the authentication
//! layer reads it and the OpenAPI document ([`openapi`]) is derived from it, so a route
//! cannot be served without an entry, nor without its description.

use std::convert::Infallible;

use axum::extract::DefaultBodyLimit;
use axum::http::Method;
use axum::middleware;
use axum::routing::{MethodRouter, delete, get, post, put};
use axum::{Extension, Router};
use utoipa::openapi::HttpMethod;
use utoipa::openapi::path::Operation;

use agentq_core::auth::Scope;

use crate::error::ApiError;
use crate::http::auth::{self, Access, Authenticator};
use crate::http::refused_body::{BodyLimit, DEFAULT_BODY_LIMIT};
use crate::state::Scheduler;

mod approvals;
mod batches;
mod budgets;
mod bulk;
mod console;
mod events;
mod files;
mod forks;
mod health;
mod limits;
mod mcp;
pub(crate) mod openapi;
mod queues;
mod redrive;
mod reports;
mod retention;
mod schedules;
mod sessions;
mod steer;
mod webhooks;

/// One route: its method, its path pattern, what it requires, its handler (made for a
/// scheduler: a body limit, the MCP service) and its OpenAPI operation.
struct Route {
    method: Method,
    path: &'static str,
    access: Access,
    handler: fn(&Scheduler) -> MethodRouter<Scheduler>,
    doc: Doc,
}

/// A route's OpenAPI description: what the `#[utoipa::path]` of its handler states (the
/// struct that attribute makes, `__path_<handler>`, implements [`utoipa::Path`]).
#[derive(Clone, Copy)]
pub(crate) struct Doc {
    /// The path the attribute states, in OpenAPI's form (`{path}`, not `{*path}`).
    pub(crate) path: fn() -> String,
    pub(crate) methods: fn() -> Vec<HttpMethod>,
    pub(crate) operation: fn() -> Operation,
}

fn doc<P: utoipa::Path>() -> Doc {
    Doc {
        path: P::path,
        methods: P::methods,
        operation: P::operation,
    }
}

fn route(
    method: Method,
    path: &'static str,
    access: Access,
    handler: fn(&Scheduler) -> MethodRouter<Scheduler>,
    doc: Doc,
) -> Route {
    Route {
        method,
        path,
        access,
        handler,
        doc,
    }
}

const WRITE: Access = Access::Scope(Scope::SessionsWrite);
const READ: Access = Access::Scope(Scope::SessionsRead);
const APPROVE: Access = Access::Scope(Scope::ApprovalsWrite);
const ADMIN: Access = Access::Scope(Scope::Admin);
const WEBHOOKS: Access = Access::Scope(Scope::Webhooks);

/// Every route of the API (see the module docs).
fn table() -> Vec<Route> {
    let mut routes = session_routes();
    routes.extend(one_session_routes());
    routes.extend(batch_routes());
    routes.extend(webhook_routes());
    routes.extend(schedule_routes());
    routes.extend(admin_routes());
    routes.extend(service_routes());
    routes
}

/// Creating, listing and acting on many sessions.
fn session_routes() -> Vec<Route> {
    vec![
        route(
            Method::POST,
            "/v1/sessions",
            WRITE,
            |_| post(sessions::create),
            doc::<sessions::__path_create>(),
        ),
        route(
            Method::GET,
            "/v1/sessions",
            READ,
            |_| get(sessions::list),
            doc::<sessions::__path_list>(),
        ),
        route(
            Method::GET,
            "/v1/sessions/counts",
            READ,
            |_| get(reports::counts),
            doc::<reports::__path_counts>(),
        ),
        route(
            Method::POST,
            "/v1/sessions/batch",
            WRITE,
            // `BatchBody` reads the body itself, under the decode budget and its limit.
            |_| post(sessions::create_batch),
            doc::<sessions::__path_create_batch>(),
        ),
        route(
            Method::POST,
            "/v1/sessions/cancel",
            WRITE,
            |_| post(bulk::cancel),
            doc::<bulk::__path_cancel>(),
        ),
        route(
            Method::POST,
            "/v1/sessions/retry",
            WRITE,
            |_| post(bulk::retry),
            doc::<bulk::__path_retry>(),
        ),
        route(
            Method::GET,
            "/v1/approvals",
            READ,
            |_| get(approvals::list),
            doc::<approvals::__path_list>(),
        ),
    ]
}

/// The routes of one session (`{id}`).
fn one_session_routes() -> Vec<Route> {
    vec![
        route(
            Method::GET,
            "/v1/sessions/{id}",
            READ,
            |_| get(sessions::get),
            doc::<sessions::__path_get>(),
        ),
        route(
            Method::GET,
            "/v1/sessions/{id}/messages",
            READ,
            |_| get(sessions::messages),
            doc::<sessions::__path_messages>(),
        ),
        route(
            Method::POST,
            "/v1/sessions/{id}/messages",
            WRITE,
            |_| post(steer::post_message),
            doc::<steer::__path_post_message>(),
        ),
        route(
            Method::POST,
            "/v1/sessions/{id}/approvals",
            APPROVE,
            |_| post(steer::approvals),
            doc::<steer::__path_approvals>(),
        ),
        route(
            Method::GET,
            "/v1/sessions/{id}/tree",
            READ,
            |_| get(steer::tree),
            doc::<steer::__path_tree>(),
        ),
        route(
            Method::GET,
            "/v1/sessions/{id}/files",
            READ,
            |_| get(files::list),
            doc::<files::__path_list>(),
        ),
        route(
            Method::GET,
            "/v1/sessions/{id}/files/{*path}",
            READ,
            |_| get(files::get),
            doc::<files::__path_get>(),
        ),
        route(
            Method::POST,
            "/v1/sessions/{id}/cancel",
            WRITE,
            |_| post(sessions::cancel),
            doc::<sessions::__path_cancel>(),
        ),
        route(
            Method::POST,
            "/v1/sessions/{id}/fork",
            WRITE,
            |_| post(forks::fork),
            doc::<forks::__path_fork>(),
        ),
        route(
            Method::POST,
            "/v1/sessions/{id}/retry",
            WRITE,
            |_| post(redrive::retry),
            doc::<redrive::__path_retry>(),
        ),
        route(
            Method::GET,
            "/v1/sessions/{id}/events",
            READ,
            |_| get(events::events),
            doc::<events::__path_events>(),
        ),
    ]
}

/// Batches as objects (`/v1/batches…`), with the session routes' scopes.
fn batch_routes() -> Vec<Route> {
    vec![
        route(
            Method::POST,
            "/v1/batches",
            WRITE,
            // A JSON body is read under the batch limit and the decode budget; an upload
            // as a stream, under its own bounds (`crate::batches`).
            |_| post(batches::create),
            doc::<batches::__path_create>(),
        ),
        route(
            Method::GET,
            "/v1/batches",
            READ,
            |_| get(batches::list),
            doc::<batches::__path_list>(),
        ),
        route(
            Method::GET,
            "/v1/batches/{id}",
            READ,
            |_| get(batches::get),
            doc::<batches::__path_get>(),
        ),
        route(
            Method::POST,
            "/v1/batches/{id}/cancel",
            WRITE,
            |_| post(batches::cancel),
            doc::<batches::__path_cancel>(),
        ),
        route(
            Method::GET,
            "/v1/batches/{id}/results",
            READ,
            |_| get(batches::results),
            doc::<batches::__path_results>(),
        ),
    ]
}

/// Schedules (`/v1/schedules…`), with the session routes' scopes: a schedule creates
/// sessions.
fn schedule_routes() -> Vec<Route> {
    vec![
        route(
            Method::POST,
            "/v1/schedules",
            WRITE,
            |_| post(schedules::create),
            doc::<schedules::__path_create>(),
        ),
        route(
            Method::GET,
            "/v1/schedules",
            READ,
            |_| get(schedules::list),
            doc::<schedules::__path_list>(),
        ),
        route(
            Method::GET,
            "/v1/schedules/{id}",
            READ,
            |_| get(schedules::get),
            doc::<schedules::__path_get>(),
        ),
        route(
            Method::DELETE,
            "/v1/schedules/{id}",
            WRITE,
            |_| delete(schedules::delete),
            doc::<schedules::__path_delete>(),
        ),
        route(
            Method::POST,
            "/v1/schedules/{id}/pause",
            WRITE,
            |_| post(schedules::pause),
            doc::<schedules::__path_pause>(),
        ),
        route(
            Method::POST,
            "/v1/schedules/{id}/resume",
            WRITE,
            |_| post(schedules::resume),
            doc::<schedules::__path_resume>(),
        ),
        route(
            Method::POST,
            "/v1/schedules/{id}/trigger",
            WRITE,
            |_| post(schedules::trigger),
            doc::<schedules::__path_trigger>(),
        ),
        route(
            Method::GET,
            "/v1/schedules/{id}/fires",
            READ,
            |_| get(schedules::fires),
            doc::<schedules::__path_fires>(),
        ),
    ]
}

/// Webhook endpoints (`/v1/webhooks…`): their own scope, since an endpoint sends the
/// tenant's events out of the system and its secret signs them.
fn webhook_routes() -> Vec<Route> {
    vec![
        route(
            Method::POST,
            "/v1/webhooks",
            WEBHOOKS,
            |_| post(webhooks::create),
            doc::<webhooks::__path_create>(),
        ),
        route(
            Method::GET,
            "/v1/webhooks",
            WEBHOOKS,
            |_| get(webhooks::list),
            doc::<webhooks::__path_list>(),
        ),
        route(
            Method::GET,
            "/v1/webhooks/{id}",
            WEBHOOKS,
            |_| get(webhooks::get),
            doc::<webhooks::__path_get>(),
        ),
        route(
            Method::DELETE,
            "/v1/webhooks/{id}",
            WEBHOOKS,
            |_| delete(webhooks::delete),
            doc::<webhooks::__path_delete>(),
        ),
        route(
            Method::POST,
            "/v1/webhooks/{id}/rotate",
            WEBHOOKS,
            |_| post(webhooks::rotate),
            doc::<webhooks::__path_rotate>(),
        ),
        route(
            Method::POST,
            "/v1/webhooks/{id}/enable",
            WEBHOOKS,
            |_| post(webhooks::enable),
            doc::<webhooks::__path_enable>(),
        ),
        route(
            Method::GET,
            "/v1/webhooks/{id}/deliveries",
            WEBHOOKS,
            |_| get(webhooks::deliveries),
            doc::<webhooks::__path_deliveries>(),
        ),
        route(
            Method::POST,
            "/v1/webhooks/{id}/redrive",
            WEBHOOKS,
            |_| post(webhooks::redrive),
            doc::<webhooks::__path_redrive>(),
        ),
    ]
}

/// Queues and the admin's routes.
fn admin_routes() -> Vec<Route> {
    vec![
        route(
            Method::GET,
            "/v1/queues",
            READ,
            |_| get(queues::list),
            doc::<queues::__path_list>(),
        ),
        route(
            Method::POST,
            "/v1/queues",
            ADMIN,
            |_| post(queues::create),
            doc::<queues::__path_create>(),
        ),
        route(
            Method::GET,
            "/v1/admin/budgets",
            ADMIN,
            |_| get(budgets::list),
            doc::<budgets::__path_list>(),
        ),
        route(
            Method::PUT,
            "/v1/admin/budgets/{tenant}",
            ADMIN,
            |_| put(budgets::set),
            doc::<budgets::__path_set>(),
        ),
        route(
            Method::GET,
            "/v1/admin/retention",
            ADMIN,
            |_| get(retention::list),
            doc::<retention::__path_list>(),
        ),
        route(
            Method::PUT,
            "/v1/admin/retention/tenants/{tenant}",
            ADMIN,
            |_| put(retention::set_tenant),
            doc::<retention::__path_set_tenant>(),
        ),
        route(
            Method::DELETE,
            "/v1/admin/retention/tenants/{tenant}",
            ADMIN,
            |_| delete(retention::delete_tenant),
            doc::<retention::__path_delete_tenant>(),
        ),
        route(
            Method::PUT,
            "/v1/admin/retention/queues/{queue}",
            ADMIN,
            |_| put(retention::set_queue),
            doc::<retention::__path_set_queue>(),
        ),
        route(
            Method::DELETE,
            "/v1/admin/retention/queues/{queue}",
            ADMIN,
            |_| delete(retention::delete_queue),
            doc::<retention::__path_delete_queue>(),
        ),
        route(
            Method::GET,
            "/v1/admin/tenants/{tenant}/spend",
            ADMIN,
            |_| get(budgets::spend),
            doc::<budgets::__path_spend>(),
        ),
        route(
            Method::GET,
            "/v1/admin/costs",
            ADMIN,
            |_| get(reports::costs),
            doc::<reports::__path_costs>(),
        ),
        route(
            Method::GET,
            "/v1/admin/operations",
            ADMIN,
            |_| get(reports::operations),
            doc::<reports::__path_operations>(),
        ),
        route(
            Method::GET,
            "/v1/admin/limits",
            ADMIN,
            |_| get(limits::state),
            doc::<limits::__path_state>(),
        ),
    ]
}

/// `/mcp`, the probes, the console and this API's description.
fn service_routes() -> Vec<Route> {
    vec![
        // Each tool checks the scope of its REST route.
        route(
            Method::POST,
            "/mcp",
            Access::Key,
            mcp::handler,
            doc::<mcp::__path_handler>(),
        ),
        route(
            Method::GET,
            "/healthz",
            Access::Open,
            |_| get(health::healthz),
            doc::<health::__path_healthz>(),
        ),
        route(
            Method::GET,
            "/readyz",
            Access::Open,
            |_| get(health::readyz),
            doc::<health::__path_readyz>(),
        ),
        // The console's files: public like this document; what the page reads goes
        // through the keyed routes above.
        route(
            Method::GET,
            "/console",
            Access::Open,
            |_| get(console::index),
            doc::<console::__path_index>(),
        ),
        route(
            Method::GET,
            "/console/{file}",
            Access::Open,
            |_| get(console::file),
            doc::<console::__path_file>(),
        ),
        route(
            Method::GET,
            "/openapi.json",
            Access::Open,
            |_| get(openapi::serve),
            doc::<openapi::__path_serve>(),
        ),
    ]
}

/// The routes of [`metrics_router`], served on a listener of their own.
fn metrics_table() -> Vec<Route> {
    vec![route(
        Method::GET,
        "/metrics",
        Access::Open,
        |_| get(health::metrics),
        doc::<health::__path_metrics>(),
    )]
}

/// Every route of [`router`]: (method, path pattern, what it requires).
pub fn route_table() -> Vec<(Method, &'static str, Access)> {
    table()
        .into_iter()
        .map(|r| (r.method, r.path, r.access))
        .collect()
}

/// The most bytes the body of `method path` may hold; past it the route answers 413
/// naming the limit (see `http::refused_body`). A session's body holds its prompt and
/// files; a batch's, many sessions'; `/mcp` carries one session's call; every other JSON
/// route takes small objects.
pub fn body_limit(s: &Scheduler, method: &Method, path: &str) -> usize {
    match (method, path) {
        (&Method::POST, "/v1/sessions" | "/mcp") => s.single_body_limit(),
        (&Method::POST, "/v1/sessions/batch" | "/v1/batches") => s.batch_body_limit(),
        _ => DEFAULT_BODY_LIMIT,
    }
}

/// `handler` with its route's body limit: for the body readers of `http` (an extension)
/// and for any of axum's own (its default limit).
fn with_body_limit(handler: MethodRouter<Scheduler>, limit: usize) -> MethodRouter<Scheduler> {
    handler
        .layer::<_, Infallible>(DefaultBodyLimit::max(limit))
        .layer::<_, Infallible>(Extension(BodyLimit(limit)))
}

/// The API on `state`. Serve it with `axum::serve` (the tests bind port 0).
pub fn router(state: Scheduler) -> Router {
    let routes = table();
    let authn = Authenticator::new(
        state.store.clone(),
        state.cfg.auth.clone(),
        routes.iter().map(|r| (r.method.clone(), r.path, r.access)),
    );
    let mut app = Router::new();
    for r in routes {
        let limit = body_limit(&state, &r.method, r.path);
        app = app.route(r.path, with_body_limit((r.handler)(&state), limit));
    }
    app.route_layer(middleware::from_fn_with_state(authn.clone(), auth::require))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(
            authn.clone(),
            auth::same_origin_writes,
        ))
        .layer(middleware::from_fn_with_state(authn, auth::loopback_hosts))
        .with_state(state)
}

/// `/metrics` alone, for a listener of its own: the API's port is for keyed clients,
/// the metrics port for the scraper (which holds no key).
pub fn metrics_router(state: Scheduler) -> Router {
    let mut app = Router::new();
    for r in metrics_table() {
        app = app.route(r.path, (r.handler)(&state));
    }
    app.fallback(not_found).with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such endpoint".into())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
