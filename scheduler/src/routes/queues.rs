//! The queues sessions may name: listing them, and creating one (admin). See
//! [`crate::queues::QueueRegistry`] for what makes a queue known.
//!
//! A queue's name tells which worker pool (often which customer's) runs its sessions, so
//! a tenant is shown only the queues its policy lets it put sessions on (the operator's
//! `[policy]` `queues`, its own section's if it has one); the admin sees them all.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;

use agentq_api::{CreateQueue, ErrorBody, QueueCreated, QueueList};
use agentq_core::QueueCreate;

use crate::error::ApiError;
use crate::http::{ApiResult, Auth, JsonBody, decode_object, respond};
use crate::request::{MAX_QUEUE_NAME, valid_queue_name};
use crate::state::Scheduler;

/// List queues
///
/// Every queue the caller may put sessions on (the admin: every queue), configured ones
/// first.
#[utoipa::path(
    get,
    path = "/v1/queues",
    operation_id = "list_queues",
    responses((status = 200, description = "The queues", body = QueueList)),
)]
pub(super) async fn list(State(s): State<Scheduler>, Auth(caller): Auth) -> ApiResult<Response> {
    let mut queues = s.queues().known(s.store.as_ref()).await?;
    if !caller.is_admin() {
        let policy = s.cfg.policy.for_tenant(&caller.tenant);
        queues.retain(|q| policy.check_queue(q).is_ok());
    }
    respond(
        StatusCode::OK,
        &QueueList {
            queues,
            max_queues: s.cfg.max_queues,
        },
    )
}

/// Create a queue
///
/// A queue sessions may then name, up to `scheduler.max_queues`.
#[utoipa::path(
    post,
    path = "/v1/queues",
    operation_id = "create_queue",
    request_body = CreateQueue,
    responses(
        (status = 201, description = "Created", body = QueueCreated),
        (status = 200, description = "It existed already", body = QueueCreated),
        (status = 409, description = "`conflict`: `scheduler.max_queues` reached (`field`: \
            `name`)", body = ErrorBody),
    ),
)]
pub(super) async fn create(
    State(s): State<Scheduler>,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let CreateQueue { name } = decode_object(body)?;
    if !valid_queue_name(&name) {
        return Err(ApiError::invalid(
            "name",
            format!("invalid queue name {name:?}: use 1 to {MAX_QUEUE_NAME} of A-Z a-z 0-9 _ . -"),
        ));
    }
    let registry = s.queues();
    if registry.is_configured(&name) {
        return respond(
            StatusCode::OK,
            &QueueCreated {
                name,
                created: false,
            },
        );
    }
    match s
        .store
        .create_queue(&name, registry.room_for_created(s.cfg.max_queues))
        .await?
    {
        QueueCreate::Created => {
            tracing::info!(queue = %name, "queue created");
            registry.learn(&name);
            registry.ensure(s.queue.as_ref(), &name).await;
            respond(
                StatusCode::CREATED,
                &QueueCreated {
                    name,
                    created: true,
                },
            )
        }
        QueueCreate::Exists => {
            registry.learn(&name);
            respond(
                StatusCode::OK,
                &QueueCreated {
                    name,
                    created: false,
                },
            )
        }
        QueueCreate::Full => Err(ApiError::ConflictOn {
            field: "name".into(),
            message: format!(
                "there are {} queues already, the most scheduler.max_queues allows",
                s.cfg.max_queues
            ),
        }),
    }
}
