//! The query of `GET /v1/sessions`, and how much one page may hold.
//!
//! Each parameter is parsed by hand so that an error names it. The store applies what an
//! index or a column serves (status, parent, batch, finish and wait reasons, queue, the
//! creation range); metadata and cost are held to on the rows read (a cost depends on
//! today's prices, a metadata entry lives in the spec), within a bound on the rows one
//! page reads ([`agentq_api::bounds::MAX_SCANNED_PER_PAGE`]).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde_json::Value;

use agentq_agent::spec::ExitReason;
use agentq_api::MAX_SEARCH_CHARS;
use agentq_core::auth::{Caller, valid_tenant};
use agentq_core::wait::WaitReason;
use agentq_core::{ListFilter, SessionRow, SessionStatus};

use crate::error::ApiError;
use crate::http::MAX_ID_LEN;
use crate::http::query::params_of;

/// The most bytes of sessions (their prompts, systems, results and errors) one page of
/// `GET /v1/sessions` holds: past it the page ends early, with a cursor to the rest, so a
/// listing costs a bounded amount of memory however large the sessions are.
pub const LIST_MAX_BYTES: usize = 16 * 1024 * 1024;

/// Most `metadata=key=value` conditions one listing takes.
pub const MAX_METADATA_FILTERS: usize = 16;

/// Query of `GET /v1/sessions` (the parameters of [`agentq_api::LIST_PARAMS`]): all
/// strings, parsed by hand so each error names its parameter. An empty one is absent.
#[derive(Debug, Default)]
pub struct ListQuery {
    pub status: Option<String>,
    pub limit: Option<String>,
    pub cursor: Option<String>,
    pub parent_id: Option<String>,
    pub batch_id: Option<String>,
    pub finish_reason: Option<String>,
    pub wait_reason: Option<String>,
    pub queue: Option<String>,
    pub created_after: Option<String>,
    pub created_before: Option<String>,
    pub min_cost_usd: Option<String>,
    pub max_cost_usd: Option<String>,
    /// Text search: an id prefix or a piece of the prompt.
    pub q: Option<String>,
    /// An admin's tenant filter.
    pub tenant: Option<String>,
    /// Every `metadata=key=value`, in order.
    pub metadata: Vec<String>,
}

/// What the rows the store answers are held to besides its filter.
#[derive(Debug, Default, Clone)]
pub struct RowFilter {
    /// Each `(key, value)` must be in the session's metadata.
    pub metadata: Vec<(String, String)>,
    pub min_cost_usd: Option<f64>,
    pub max_cost_usd: Option<f64>,
}

impl RowFilter {
    /// Whether any condition is left to the rows (so a page may skip some).
    pub fn is_empty(&self) -> bool {
        self.metadata.is_empty() && self.min_cost_usd.is_none() && self.max_cost_usd.is_none()
    }

    /// Whether `row`, costing `cost` (`None`: its model has no price), passes.
    pub fn admits(&self, row: &SessionRow, cost: Option<f64>) -> bool {
        let meta_ok = self
            .metadata
            .iter()
            .all(|(k, v)| match row.spec.metadata.get(k) {
                Some(Value::String(s)) => s == v,
                // A number or a boolean matches its JSON text (`n=3`, `flag=true`).
                Some(other @ (Value::Number(_) | Value::Bool(_))) => {
                    serde_json::from_str::<Value>(v).is_ok_and(|given| given == *other)
                }
                _ => false,
            });
        // A session without a price has no cost to compare: a cost bound leaves it out.
        let cost_ok = match (self.min_cost_usd, self.max_cost_usd) {
            (None, None) => true,
            (min, max) => {
                cost.is_some_and(|c| min.is_none_or(|m| c >= m) && max.is_none_or(|m| c <= m))
            }
        };
        meta_ok && cost_ok
    }
}

impl ListQuery {
    /// From the query's pairs: `metadata` may repeat, every other parameter of
    /// [`agentq_api::LIST_PARAMS`] is given at most once.
    pub fn from_pairs(pairs: Vec<(String, String)>) -> Result<ListQuery, ApiError> {
        ListQuery::from_pairs_of(pairs, agentq_api::LIST_PARAMS)
    }

    /// As [`ListQuery::from_pairs`], for a route that takes the parameters `known` (the
    /// counts take the listing's filters without its paging).
    pub fn from_pairs_of(
        pairs: Vec<(String, String)>,
        known: &[&str],
    ) -> Result<ListQuery, ApiError> {
        let (meta, rest): (Vec<_>, Vec<_>) = pairs.into_iter().partition(|(k, _)| k == "metadata");
        let mut p = params_of(rest, known)?;
        let mut q = ListQuery::from_params(&mut p)?;
        if meta.len() > MAX_METADATA_FILTERS {
            return Err(ApiError::invalid(
                "metadata",
                format!("at most {MAX_METADATA_FILTERS} conditions"),
            ));
        }
        for (_, v) in meta {
            crate::http::body::no_nul("metadata", &v)?;
            q.metadata.push(v);
        }
        Ok(q)
    }

    fn from_params(p: &mut BTreeMap<String, String>) -> Result<ListQuery, ApiError> {
        let mut take = |k: &str| p.remove(k).filter(|v| !v.is_empty());
        let q = ListQuery {
            status: take("status"),
            limit: take("limit"),
            cursor: take("cursor"),
            parent_id: take("parent_id"),
            batch_id: take("batch_id"),
            finish_reason: take("finish_reason"),
            wait_reason: take("wait_reason"),
            queue: take("queue"),
            created_after: take("created_after"),
            created_before: take("created_before"),
            min_cost_usd: take("min_cost_usd"),
            max_cost_usd: take("max_cost_usd"),
            q: take("q"),
            tenant: take("tenant"),
            metadata: Vec::new(),
        };
        if let Some(q) = &q.q {
            crate::http::body::no_nul("q", q)?;
            let n = q.chars().count();
            if n > MAX_SEARCH_CHARS {
                return Err(ApiError::invalid(
                    "q",
                    format!("at most {MAX_SEARCH_CHARS} characters, got {n}"),
                ));
            }
        }
        if q.tenant.as_deref().is_some_and(|t| !valid_tenant(t)) {
            return Err(ApiError::invalid("tenant", "is not a tenant name"));
        }
        for (field, v, what) in [
            ("cursor", &q.cursor, "is not a session id"),
            ("parent_id", &q.parent_id, "is not a session id"),
            ("batch_id", &q.batch_id, "is not a batch id"),
            ("queue", &q.queue, "is not a queue name"),
        ] {
            if v.as_ref().is_some_and(|v| v.len() > MAX_ID_LEN) {
                return Err(ApiError::invalid(field, what));
            }
        }
        Ok(q)
    }

    /// The tenant `caller` lists: an admin every tenant, or the one it names in `tenant`;
    /// any other key its own. A key that names another tenant than its own is refused
    /// (403 naming `tenant`) rather than shown its own sessions as if they were that
    /// tenant's; naming its own is the same as naming none.
    pub fn tenant_for(&self, caller: &Caller) -> Result<Option<String>, ApiError> {
        match (&self.tenant, caller.is_admin()) {
            (named, true) => Ok(named.clone()),
            (Some(t), false) if *t != caller.tenant => Err(ApiError::Forbidden {
                field: Some("tenant".into()),
                message: "only a key with the admin scope may name another tenant".into(),
            }),
            (_, false) => Ok(Some(caller.tenant.clone())),
        }
    }

    /// The store's filter (for `caller`'s tenants, see [`ListQuery::tenant_for`]; its
    /// `limit` left to the reader) and the conditions left to the rows.
    pub fn filters(&self, caller: &Caller) -> Result<(ListFilter, RowFilter), ApiError> {
        let filter = ListFilter {
            tenant: self.tenant_for(caller)?,
            text: self.q.clone(),
            status: self.status.as_deref().map(status).transpose()?,
            parent_id: self.parent_id.clone(),
            batch_id: self.batch_id.clone(),
            finish_reason: self
                .finish_reason
                .as_deref()
                .map(finish_reason)
                .transpose()?,
            wait_reason: self.wait_reason.as_deref().map(wait_reason).transpose()?,
            queue: self.queue.clone(),
            created_after: time("created_after", self.created_after.as_deref())?,
            created_before: time("created_before", self.created_before.as_deref())?,
            limit: 0,
            cursor: self.cursor.clone(),
            oldest_first: false,
        };
        let rows = RowFilter {
            metadata: self
                .metadata
                .iter()
                .map(|m| {
                    m.split_once('=')
                        .filter(|(k, _)| !k.is_empty())
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .ok_or_else(|| {
                            ApiError::invalid("metadata", format!("must be key=value, got {m:?}"))
                        })
                })
                .collect::<Result<_, _>>()?,
            min_cost_usd: cost("min_cost_usd", self.min_cost_usd.as_deref())?,
            max_cost_usd: cost("max_cost_usd", self.max_cost_usd.as_deref())?,
        };
        Ok((filter, rows))
    }
}

fn status(st: &str) -> Result<SessionStatus, ApiError> {
    SessionStatus::parse(st).ok_or_else(|| {
        ApiError::invalid(
            "status",
            format!(
                "unknown status {st:?} (expected queued, running, waiting, \
                 awaiting_approval, completed, failed or cancelled)"
            ),
        )
    })
}

fn finish_reason(r: &str) -> Result<ExitReason, ApiError> {
    serde_json::from_value(Value::String(r.to_string())).map_err(|_| {
        ApiError::invalid(
            "finish_reason",
            format!(
                "unknown finish reason {r:?} (expected stop, max_iterations, interrupted, \
                 timeout, error, yielded, budget_exhausted or stuck)"
            ),
        )
    })
}

fn wait_reason(r: &str) -> Result<WaitReason, ApiError> {
    WaitReason::parse(r).ok_or_else(|| {
        ApiError::invalid(
            "wait_reason",
            format!(
                "unknown wait reason {r:?} (expected children, approval, rate_limit or budget)"
            ),
        )
    })
}

fn time(field: &str, v: Option<&str>) -> Result<Option<DateTime<Utc>>, ApiError> {
    v.map(|t| {
        DateTime::parse_from_rfc3339(t)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|_| ApiError::invalid(field, format!("must be an RFC 3339 time, got {t:?}")))
    })
    .transpose()
}

fn cost(field: &str, v: Option<&str>) -> Result<Option<f64>, ApiError> {
    v.map(|c| {
        c.parse::<f64>()
            .ok()
            .filter(|c| c.is_finite() && *c >= 0.0)
            .ok_or_else(|| {
                ApiError::invalid(
                    field,
                    format!("must be a number of dollars >= 0, got {c:?}"),
                )
            })
    })
    .transpose()
}
