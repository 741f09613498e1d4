//! Creating sessions on Postgres: a batch is one multi-row insert from arrays, and the
//! rows that already existed (a repeated idempotency key or id) are read in one more
//! statement.

use std::collections::{HashMap, HashSet};

use sqlx::PgExecutor;
use sqlx::postgres::{PgArguments, PgPool};

use crate::error::Result;
use crate::model::{NewSession, SessionRow};
use crate::rowconv::to_i32;
use crate::sql::escape::to_stored_json;
use crate::sql::outcome::{fresh_phase, unreadable_conflict};
use crate::sql::record::SessionRecord;
use crate::sql::statements::COLS;

use super::params::{Params, unnest_ordered};

/// `CREATE` for a batch: one multi-row insert from arrays (`input`, one per column of a
/// new session, in order), the specs beside the rows. A fresh history is the prompt alone,
/// which the spec holds, so no message is stored (`history_len` 1). `answer` selects what
/// comes back from `ins` (the rows inserted), joined to `input`: [`ROWS`] or [`IDS`].
fn insert_sessions(input: &str, answer: &str) -> String {
    format!(
        "
WITH input AS (
    SELECT * FROM {input}
), ins AS (
    INSERT INTO sessions (id, root_id, parent_id, depth, queue, status, phase,
                          idempotency_key, idempotency_hash, tenant, history_len,
                          priority, batch_id, batch_max_running, held, capped, custom_id)
    SELECT id, root_id, parent_id, depth, queue, 'queued', phase, idempotency_key,
           idempotency_hash, tenant, 1, priority, batch_id, batch_max_running, held, capped,
           custom_id
    FROM input ORDER BY ord
    ON CONFLICT DO NOTHING
    RETURNING *
), specs AS (
    INSERT INTO session_specs (root_id, id, spec)
    SELECT ins.root_id, ins.id, input.spec::json FROM ins JOIN input ON input.id = ins.id
)
SELECT {answer} FROM ins JOIN input ON input.id = ins.id"
    )
}

/// The rows inserted, whole. The spec is answered from the input: a statement does not
/// see what its own other parts insert.
const ROWS: &str = "ins.*, input.spec::json AS spec";
/// Only the ids inserted (a batch object's creation, which answers no row).
const IDS: &str = "ins.id";

/// Existing rows of sessions that were not inserted, by (tenant, idempotency key) and by
/// id.
#[derive(Default)]
struct Existing {
    by_key: HashMap<(String, String), SessionRow>,
    by_id: HashMap<String, SessionRow>,
}

impl Existing {
    fn add(&mut self, row: SessionRow) {
        if let Some(k) = &row.idempotency_key {
            self.by_key
                .insert((row.tenant.clone(), k.clone()), row.clone());
        }
        self.by_id.insert(row.id.clone(), row);
    }

    fn find(&self, s: &NewSession) -> Option<&SessionRow> {
        s.idempotency_key
            .as_ref()
            .and_then(|k| self.by_key.get(&(s.tenant.clone(), k.clone())))
            .or_else(|| self.by_id.get(&s.id))
    }
}

pub(super) async fn create_sessions(
    pool: &PgPool,
    new: &[NewSession],
    objects: Option<&crate::blob::s3::S3Blobs>,
) -> Result<Vec<(SessionRow, bool)>> {
    if new.is_empty() {
        return Ok(Vec::new());
    }
    let with_files = new
        .iter()
        .any(|s| !s.files.is_empty() || s.workspace_from.is_some());
    let (mut inserted, existing) = if with_files {
        // A session and its files are one transaction.
        let mut tx = pool.begin().await?;
        let inserted = insert(&mut *tx, new).await?;
        super::workspace::add_inputs(&mut tx, new, |id| inserted.contains_key(id), objects).await?;
        let existing = existing(&mut *tx, &not_inserted(new, &inserted)).await?;
        tx.commit().await?;
        (inserted, existing)
    } else {
        let inserted = insert(pool, new).await?;
        // Items that were not inserted: an existing row with the same idempotency key (or
        // id). Read after the insert, so it sees rows of a concurrent insert that the
        // conflict waited for.
        let existing = existing(pool, &not_inserted(new, &inserted)).await?;
        (inserted, existing)
    };
    let mut out: Vec<(SessionRow, bool)> = Vec::with_capacity(new.len());
    // Where each row inserted here sits in `out`, by key and by id: a later duplicate of
    // an item answers with a copy of it, and only a duplicate costs one (a batch holds
    // each spec once, not once per index).
    let mut by_key: HashMap<(&str, &str), usize> = HashMap::new();
    let mut by_id: HashMap<&str, usize> = HashMap::new();
    for s in new {
        // Take the inserted row once: a later duplicate of the same item is a repeat.
        if let Some(row) = inserted.remove(&s.id) {
            if let Some(k) = &s.idempotency_key {
                by_key
                    .entry((s.tenant.as_str(), k.as_str()))
                    .or_insert(out.len());
            }
            by_id.insert(s.id.as_str(), out.len());
            out.push((row, true));
            continue;
        }
        let earlier = s
            .idempotency_key
            .as_deref()
            .and_then(|k| by_key.get(&(s.tenant.as_str(), k)))
            .or_else(|| by_id.get(s.id.as_str()))
            .copied();
        let row = match earlier {
            Some(i) => out[i].0.clone(),
            None => existing
                .find(s)
                .cloned()
                .ok_or_else(|| unreadable_conflict(s))?,
        };
        out.push((row, false));
    }
    Ok(out)
}

fn not_inserted<'a>(
    new: &'a [NewSession],
    inserted: &HashMap<String, SessionRow>,
) -> Vec<&'a NewSession> {
    new.iter()
        .filter(|s| !inserted.contains_key(&s.id))
        .collect()
}

/// Insert the batch; the rows inserted, by id.
pub(super) async fn insert<'e>(
    pool: impl PgExecutor<'e>,
    new: &[NewSession],
) -> Result<HashMap<String, SessionRow>> {
    let (input, args) = input(new, &[])?;
    let inserted: Vec<SessionRecord> = sqlx::query_as_with(&insert_sessions(&input, ROWS), args)
        .fetch_all(pool)
        .await?;
    inserted
        .into_iter()
        .map(|r| r.into_row().map(|row| (row.id.clone(), row)))
        .collect()
}

/// Insert the batch, item `i` with `custom_ids[i]`; the ids inserted.
pub(super) async fn insert_ids<'e>(
    pool: impl PgExecutor<'e>,
    new: &[NewSession],
    custom_ids: &[Option<&str>],
) -> Result<HashSet<String>> {
    let (input, args) = input(new, custom_ids)?;
    let ids: Vec<String> = sqlx::query_scalar_with(&insert_sessions(&input, IDS), args)
        .fetch_all(pool)
        .await?;
    Ok(ids.into_iter().collect())
}

/// The `input` of [`insert_sessions`] and its arguments: one array per column, item `i`
/// with `custom_ids[i]` (none past its end).
fn input(new: &[NewSession], custom_ids: &[Option<&str>]) -> Result<(String, PgArguments)> {
    let n = new.len();
    let mut ids = Vec::with_capacity(n);
    let mut roots = Vec::with_capacity(n);
    let mut parents = Vec::with_capacity(n);
    let mut depths = Vec::with_capacity(n);
    let mut queues = Vec::with_capacity(n);
    let mut specs = Vec::with_capacity(n);
    let mut phases = Vec::with_capacity(n);
    let mut keys = Vec::with_capacity(n);
    let mut hashes = Vec::with_capacity(n);
    let mut tenants = Vec::with_capacity(n);
    let mut priorities = Vec::with_capacity(n);
    let mut batches = Vec::with_capacity(n);
    let mut caps = Vec::with_capacity(n);
    let mut held = Vec::with_capacity(n);
    let mut capped = Vec::with_capacity(n);
    let mut customs = Vec::with_capacity(n);
    for (i, s) in new.iter().enumerate() {
        priorities.push(i32::from(s.sched.priority));
        batches.push(s.sched.batch_id.as_deref());
        caps.push(
            s.sched
                .batch_max_running
                .map(|c| to_i32(c, "batch_max_running"))
                .transpose()?,
        );
        held.push(s.sched.held);
        capped.push(s.sched.capped);
        ids.push(s.id.as_str());
        roots.push(s.root_id.as_str());
        parents.push(s.parent_id.as_deref());
        depths.push(to_i32(s.depth, "depth")?);
        queues.push(s.queue.as_str());
        specs.push(to_stored_json(&s.spec)?);
        phases.push(fresh_phase(s));
        keys.push(s.idempotency_key.as_deref());
        hashes.push(s.idempotency_hash.as_deref());
        tenants.push(s.tenant.as_str());
        customs.push(custom_ids.get(i).copied().flatten());
    }
    let mut p = Params::default();
    let input = unnest_ordered(
        "i",
        &[
            ("id", p.array(&ids, "text")?),
            ("root_id", p.array(&roots, "text")?),
            ("parent_id", p.array(&parents, "text")?),
            ("depth", p.array(&depths, "int")?),
            ("queue", p.array(&queues, "text")?),
            // By value: encoded into the statement's arguments at once, so the batch's
            // specs are not held twice while the statement runs.
            ("spec", p.array(specs, "text")?),
            ("phase", p.array(&phases, "text")?),
            ("idempotency_key", p.array(&keys, "text")?),
            ("idempotency_hash", p.array(&hashes, "text")?),
            ("tenant", p.array(&tenants, "text")?),
            ("priority", p.array(&priorities, "int")?),
            ("batch_id", p.array(&batches, "text")?),
            ("batch_max_running", p.array(&caps, "int")?),
            ("held", p.array(&held, "bool")?),
            ("capped", p.array(&capped, "bool")?),
            ("custom_id", p.array(&customs, "text")?),
        ],
    );
    Ok((input, p.into_args()))
}

/// The existing rows of `missing`, in one statement.
async fn existing<'e>(pool: impl PgExecutor<'e>, missing: &[&NewSession]) -> Result<Existing> {
    let mut found = Existing::default();
    if missing.is_empty() {
        return Ok(found);
    }
    let ids: Vec<&str> = missing.iter().map(|s| s.id.as_str()).collect();
    let (tenants, keys): (Vec<&str>, Vec<&str>) = missing
        .iter()
        .filter_map(|s| Some((s.tenant.as_str(), s.idempotency_key.as_deref()?)))
        .unzip();
    let sql = format!(
        "SELECT {COLS} FROM sessions WHERE id = ANY($1) \
         OR (tenant, idempotency_key) IN (SELECT * FROM UNNEST($2::text[], $3::text[]))"
    );
    let rows: Vec<SessionRecord> = sqlx::query_as(&sql)
        .bind(&ids)
        .bind(&tenants)
        .bind(&keys)
        .fetch_all(pool)
        .await?;
    for r in rows {
        found.add(r.into_row()?);
    }
    Ok(found)
}
