//! The HTTP API's routes. Each module serves one part of the API and imports only the
//! shared helpers of [`crate::http`], never another route module.
//!
//! [`table`] is every route with what it requires; the router is built from it and the
//! authentication layer reads it, so a route cannot be served without an entry.

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::Method;
use axum::middleware;
use axum::routing::{MethodRouter, get, post, put};

use agentq_core::auth::Scope;

use crate::error::ApiError;
use crate::http::auth::{self, Access, Authenticator};
use crate::state::Scheduler;

mod batches;
mod budgets;
mod bulk;
mod events;
mod files;
mod health;
mod limits;
mod mcp;
mod queues;
mod redrive;
mod sessions;
mod steer;

/// One route: its method, its path pattern, what it requires, and its handler.
struct Route {
    method: Method,
    path: &'static str,
    access: Access,
    handler: MethodRouter<Scheduler>,
}

fn route(
    method: Method,
    path: &'static str,
    access: Access,
    handler: MethodRouter<Scheduler>,
) -> Route {
    Route {
        method,
        path,
        access,
        handler,
    }
}

/// Every route of the API (see the module docs).
fn table(state: &Scheduler) -> Vec<Route> {
    use Access::Open;
    const WRITE: Access = Access::Scope(Scope::SessionsWrite);
    const READ: Access = Access::Scope(Scope::SessionsRead);
    const APPROVE: Access = Access::Scope(Scope::ApprovalsWrite);
    const ADMIN: Access = Access::Scope(Scope::Admin);
    let single_limit = state.single_body_limit();
    let (g, p) = (Method::GET, Method::POST);
    let mut routes = vec![
        route(
            p.clone(),
            "/v1/sessions",
            WRITE,
            post(sessions::create).layer(DefaultBodyLimit::max(single_limit)),
        ),
        route(g.clone(), "/v1/sessions", READ, get(sessions::list)),
        route(
            p.clone(),
            "/v1/sessions/batch",
            WRITE,
            // `BatchBody` reads the body itself, under the decode budget and this limit.
            post(sessions::create_batch).layer(DefaultBodyLimit::max(state.batch_body_limit())),
        ),
        route(p.clone(), "/v1/sessions/cancel", WRITE, post(bulk::cancel)),
        route(p.clone(), "/v1/sessions/retry", WRITE, post(bulk::retry)),
        route(g.clone(), "/v1/sessions/{id}", READ, get(sessions::get)),
        route(
            g.clone(),
            "/v1/sessions/{id}/messages",
            READ,
            get(sessions::messages),
        ),
        route(
            p.clone(),
            "/v1/sessions/{id}/messages",
            WRITE,
            post(steer::post_message),
        ),
        route(
            p.clone(),
            "/v1/sessions/{id}/approvals",
            APPROVE,
            post(steer::approvals),
        ),
        route(g.clone(), "/v1/sessions/{id}/tree", READ, get(steer::tree)),
        route(g.clone(), "/v1/sessions/{id}/files", READ, get(files::list)),
        route(
            g.clone(),
            "/v1/sessions/{id}/files/{*path}",
            READ,
            get(files::get),
        ),
        route(
            p.clone(),
            "/v1/sessions/{id}/cancel",
            WRITE,
            post(sessions::cancel),
        ),
        route(
            p.clone(),
            "/v1/sessions/{id}/retry",
            WRITE,
            post(redrive::retry),
        ),
        route(
            g.clone(),
            "/v1/sessions/{id}/events",
            READ,
            get(events::events),
        ),
        route(g.clone(), "/v1/queues", READ, get(queues::list)),
        route(p.clone(), "/v1/queues", ADMIN, post(queues::create)),
        route(g.clone(), "/v1/admin/budgets", ADMIN, get(budgets::list)),
        route(
            Method::PUT,
            "/v1/admin/budgets/{tenant}",
            ADMIN,
            put(budgets::set),
        ),
        route(
            g.clone(),
            "/v1/admin/tenants/{tenant}/spend",
            ADMIN,
            get(budgets::spend),
        ),
        route(g.clone(), "/v1/admin/limits", ADMIN, get(limits::state)),
        // Each tool checks the scope of its REST route.
        route(p.clone(), "/mcp", Access::Key, mcp::handler(state)),
        route(g.clone(), "/healthz", Open, get(health::healthz)),
        route(g, "/readyz", Open, get(health::readyz)),
    ];
    routes.extend(batch_routes(state));
    routes
}

/// The routes of batches as objects (`/v1/batches…`), with the session routes' scopes.
fn batch_routes(state: &Scheduler) -> Vec<Route> {
    const WRITE: Access = Access::Scope(Scope::SessionsWrite);
    const READ: Access = Access::Scope(Scope::SessionsRead);
    let (g, p) = (Method::GET, Method::POST);
    vec![
        route(
            p.clone(),
            "/v1/batches",
            WRITE,
            // A JSON body is read under the batch limit and the decode budget; an upload
            // as a stream, under its own bounds (`crate::batches`).
            post(batches::create).layer(DefaultBodyLimit::max(state.batch_body_limit())),
        ),
        route(g.clone(), "/v1/batches", READ, get(batches::list)),
        route(g.clone(), "/v1/batches/{id}", READ, get(batches::get)),
        route(p, "/v1/batches/{id}/cancel", WRITE, post(batches::cancel)),
        route(g, "/v1/batches/{id}/results", READ, get(batches::results)),
    ]
}

/// Every route of [`router`]: (method, path pattern, what it requires).
pub fn route_table(state: &Scheduler) -> Vec<(Method, &'static str, Access)> {
    table(state)
        .into_iter()
        .map(|r| (r.method, r.path, r.access))
        .collect()
}

/// The API on `state`. Serve it with `axum::serve` (the tests bind port 0).
pub fn router(state: Scheduler) -> Router {
    let routes = table(&state);
    let authn = Authenticator::new(
        state.store.clone(),
        state.cfg.auth.clone(),
        routes.iter().map(|r| (r.method.clone(), r.path, r.access)),
    );
    let mut app = Router::new();
    for r in routes {
        app = app.route(r.path, r.handler);
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
    Router::new()
        .route("/metrics", get(health::metrics))
        .fallback(not_found)
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such endpoint".into())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
