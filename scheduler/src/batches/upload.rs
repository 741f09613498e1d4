//! Reading a `POST /v1/batches` and checking every item before anything is written: a
//! JSON body (`{"requests": [...], "max_running", "metadata"}`, under the batch body
//! limit and the decode budget, as `POST /v1/sessions/batch` reads one) or a JSON Lines
//! upload (one item a line, the options in the query, read as a stream: `lines`). Each
//! item goes through the same checks as a session request (`request::parse_batch_item`,
//! the idempotency hash, the tenant's policy, its queue, its `workspace_from`), named by
//! where the client wrote it (`requests[3].mode`, `line 17.mode`), and is written to the
//! spool. The first bad item refuses the batch.

use std::collections::BTreeMap;

use axum::body::Body;
use serde_json::Value;
use serde_json::value::RawValue;

use agentq_api::CreateBatch;
use agentq_api::de::struct_fields;
use agentq_core::auth::Caller;
use agentq_core::policy::TenantPolicy;

use crate::actions::{limits, new_session, request_hash};
use crate::error::ApiError;
use crate::http::batch_body::BatchBody;
use crate::http::body::{Shape, path, scan};
use crate::http::refused_body::drain;
use crate::inputs::Sources;
use crate::request::{BatchOptions, Limits, check_policy, parse_batch_item};
use crate::state::Scheduler;

use super::lines::Lines;
use super::spool::{Entry, SpoolReader, SpoolWriter};

/// Bytes of one JSON Lines upload at most.
pub const MAX_UPLOAD_BYTES: u64 = 1024 * 1024 * 1024;

/// A batch whose every item was checked and spooled.
pub(crate) struct Checked {
    pub spool: SpoolReader,
    pub items: usize,
    /// Items per queue (whether a queue's are held for the dispatcher depends on how
    /// many).
    pub per_queue: BTreeMap<String, usize>,
    pub options: BatchOptions,
}

/// The checks every item passes, and the spool it goes to.
struct Checker<'a> {
    s: &'a Scheduler,
    caller: &'a Caller,
    limits: Limits,
    policy: &'a TenantPolicy,
    sources: Sources,
    spool: SpoolWriter,
    items: usize,
    per_queue: BTreeMap<String, usize>,
}

impl<'a> Checker<'a> {
    async fn new(s: &'a Scheduler, caller: &'a Caller) -> Result<Checker<'a>, ApiError> {
        Ok(Checker {
            s,
            caller,
            limits: limits(s, caller),
            policy: s.cfg.policy.for_tenant(&caller.tenant),
            sources: Sources::default(),
            spool: SpoolWriter::new().await?,
            items: 0,
            per_queue: BTreeMap::new(),
        })
    }

    /// Check the item written at `at` and spool it.
    async fn item(&mut self, value: Value, at: String) -> Result<(), ApiError> {
        let (mut req, custom_id) = parse_batch_item(value, &self.limits, &at)?;
        // Of what was asked, before the policy fills in its bounds (as for one session).
        let hash = request_hash(&req)?;
        check_policy(&mut req, self.policy, &at)?;
        self.s
            .queues()
            .check_known(self.s.store.as_ref(), &req.queue, &path(&at, "queue"))
            .await?;
        self.sources.check(self.s, self.caller, &req, &at).await?;
        let session = new_session(req, self.caller, hash);
        let n = self.per_queue.entry(session.queue.clone()).or_default();
        *n = n.saturating_add(1);
        self.spool
            .push(&Entry {
                at,
                session,
                custom_id,
            })
            .await?;
        self.items = self.items.saturating_add(1);
        Ok(())
    }

    async fn finish(self, options: BatchOptions) -> Result<Checked, ApiError> {
        Ok(Checked {
            spool: self.spool.finish().await?,
            items: self.items,
            per_queue: self.per_queue,
            options,
        })
    }
}

fn invalid_batch(message: String) -> ApiError {
    ApiError::Invalid {
        code: "invalid_batch",
        field: Some("requests".into()),
        message,
    }
}

/// A JSON body: the fields of [`CreateBatch`] (any other refused, naming it), the
/// `requests` array's shape, the options, then each item in order.
pub(crate) async fn json_body(
    s: &Scheduler,
    caller: &Caller,
    body: BatchBody,
) -> Result<Checked, ApiError> {
    let BatchBody { bytes, grant } = body;
    if scan(&bytes)? != Shape::Object {
        return Err(ApiError::Invalid {
            code: "invalid_body",
            field: None,
            message: "expected a JSON object: {\"requests\": [...], \"max_running\", \
                      \"metadata\"} (or a JSON Lines upload)"
                .into(),
        });
    }
    let mut fields: BTreeMap<String, &RawValue> = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::InvalidJson(format!("invalid JSON: {e}")))?;
    let declared = struct_fields::<CreateBatch>();
    if let Some(k) = fields.keys().find(|k| !declared.contains(&k.as_str())) {
        return Err(ApiError::Invalid {
            code: "unknown_field",
            field: Some(path("", k)),
            message: format!(
                "unknown field `{k}` (expected one of {})",
                declared.join(", ")
            ),
        });
    }
    let requests: Vec<&RawValue> = match fields.remove("requests") {
        None => return Err(ApiError::invalid("requests", "is required")),
        Some(raw) => serde_json::from_str(raw.get())
            .map_err(|_| invalid_batch("expected a JSON array of session requests".into()))?,
    };
    let max = s.cfg.max_batch;
    if requests.is_empty() || requests.len() > max {
        return Err(invalid_batch(format!(
            "a batch holds 1 to {max} requests in a JSON body, got {} (upload more as JSON \
             Lines)",
            requests.len()
        )));
    }
    let mut value = |name: &str| -> Result<Value, ApiError> {
        fields.remove(name).map_or(Ok(Value::Null), |raw| {
            serde_json::from_str(raw.get()).map_err(|e| ApiError::invalid(name, e.to_string()))
        })
    };
    let options = BatchOptions::from_fields(value("max_running")?, value("metadata")?)?;
    let mut checker = Checker::new(s, caller).await?;
    for (i, raw) in requests.iter().enumerate() {
        let at = format!("requests[{i}]");
        let item: Value = serde_json::from_str(raw.get())
            .map_err(|e| ApiError::invalid(at.clone(), e.to_string()))?;
        checker.item(item, at).await?;
    }
    // The items are spooled: the body and its share of the decode budget go before the
    // store's work.
    drop(requests);
    drop(bytes);
    drop(grant);
    checker.finish(options).await
}

/// A JSON Lines upload (see the module docs); blank lines are skipped, and counted in
/// the line numbers. The options come from the query: `max_running` and `metadata`. On a
/// refusal, what the client still sends of the body is read and dropped (up to
/// [`DRAIN_BYTES`](crate::http::refused_body::DRAIN_BYTES)) before the answer goes: a client that is still writing when the
/// server answers and closes would see its write fail, not the answer.
pub(crate) async fn json_lines(
    s: &Scheduler,
    caller: &Caller,
    query: Result<BatchOptions, ApiError>,
    body: Body,
) -> Result<Checked, ApiError> {
    let mut body = body.into_data_stream();
    let checked = match query {
        Ok(options) => read_lines(s, caller, options, &mut body).await,
        Err(e) => Err(e),
    };
    if checked.is_err() {
        drain(&mut body).await;
    }
    checked
}

/// The lines of `body`, each checked and spooled.
async fn read_lines<S, E>(
    s: &Scheduler,
    caller: &Caller,
    options: BatchOptions,
    body: &mut S,
) -> Result<Checked, ApiError>
where
    S: futures::Stream<Item = Result<axum::body::Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let grant = s.decoding.grant(&caller.tenant);
    let mut lines = Lines::new(body, s.single_body_limit(), MAX_UPLOAD_BYTES, grant);
    let max = s.cfg.max_batch_items;
    let mut checker = Checker::new(s, caller).await?;
    while let Some((n, line)) = lines.next_line().await? {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let at = format!("line {n}");
        if checker.items >= max {
            return Err(ApiError::TooLarge {
                field: Some(at),
                message: format!("an upload holds at most {max} sessions"),
            });
        }
        scan(line).map_err(|e| under(e, &at))?;
        let item: Value = serde_json::from_slice(line).map_err(|e| ApiError::InvalidJsonAt {
            field: at.clone(),
            message: format!("invalid JSON: {e}"),
        })?;
        checker.item(item, at).await?;
    }
    if checker.items == 0 {
        return Err(ApiError::Invalid {
            code: "invalid_batch",
            field: None,
            message: format!(
                "an upload holds 1 to {max} sessions, one JSON object a line; got none"
            ),
        });
    }
    checker.finish(options).await
}

/// An error of the scan of one line, named under the line (`line 3.prompt`).
fn under(e: ApiError, at: &str) -> ApiError {
    let within = |field: Option<String>| Some(field.map_or(at.to_string(), |f| path(at, &f)));
    match e {
        ApiError::InvalidJson(message) => ApiError::InvalidJsonAt {
            field: at.to_string(),
            message,
        },
        ApiError::Invalid {
            code,
            field,
            message,
        } => ApiError::Invalid {
            code,
            field: within(field),
            message,
        },
        ApiError::TooLarge { field, message } => ApiError::TooLarge {
            field: within(field),
            message,
        },
        other => other,
    }
}
