//! A batch from the client's side: its requests sent in the chunks the server takes, all
//! under one batch id (the first chunk's; the others join it), a refused item named by
//! where the user wrote it (`tasks.jsonl:5`, or the file of `--each`), and `--wait`
//! following the batch by listing it, with a live progress line.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use agentq_api::{BatchResponse, ListResponse};
use agentq_core::{Completion, SessionStatus};

use super::api::{Api, ApiFailure, encode};
use super::wait::completion_from_view;
use crate::progress::Progress;

/// Items per `POST /v1/sessions/batch` (the server's default limit).
const BATCH_CHUNK: usize = 10_000;
/// Bytes of one batch the client sends at most: the server's body limit, less room for
/// the array's commas and brackets.
const BATCH_BYTES: usize = agentq_scheduler::BATCH_BODY_LIMIT - 1024 * 1024;
/// How often `--wait` lists the batch.
const POLL_EVERY: Duration = Duration::from_secs(1);
/// Without a terminal: a progress line this often.
const PLAIN_EVERY: Duration = Duration::from_secs(5);
/// Sessions per page of the listing `--wait` reads.
const PAGE: u32 = 1000;

/// One request of a batch and where the user wrote it.
#[derive(Debug)]
pub(super) struct Item {
    pub(super) origin: String,
    pub(super) body: Value,
}

/// What a submitted batch is: its id (absent from a server that predates it) and its
/// sessions in the order of the items.
pub(super) struct Submitted {
    pub(super) batch_id: Option<String>,
    pub(super) ids: Vec<String>,
}

/// Send `items` in chunks under one batch id; each id is printed as its chunk is
/// accepted (with its origin when `with_origin`), so a failure part way leaves the ids
/// already created on the screen.
pub(super) async fn send(
    api: &Api,
    items: &[Item],
    max_running: Option<u32>,
    with_origin: bool,
) -> anyhow::Result<Submitted> {
    let bodies: Vec<&Value> = items.iter().map(|i| &i.body).collect();
    let mut out = Submitted {
        batch_id: None,
        ids: Vec::with_capacity(items.len()),
    };
    for (offset, chunk) in batch_chunks(&bodies)? {
        let mut q = Vec::new();
        if let Some(n) = max_running {
            q.push(format!("max_running={n}"));
        }
        if let Some(b) = &out.batch_id {
            q.push(format!("batch_id={}", encode(b)));
        }
        let path = if q.is_empty() {
            "/v1/sessions/batch".to_string()
        } else {
            format!("/v1/sessions/batch?{}", q.join("&"))
        };
        let (_, body): (u16, BatchResponse) = api
            .post(&path, &chunk)
            .await
            .map_err(|e| batch_error(e, offset, out.ids.len(), items))?;
        if out.batch_id.is_none() {
            out.batch_id = body.batch_id;
        }
        for (s, item) in body.sessions.into_iter().zip(&items[offset..]) {
            if with_origin {
                println!("{}\t{}", s.id, item.origin);
            } else {
                println!("{}", s.id);
            }
            out.ids.push(s.id);
        }
    }
    Ok(out)
}

/// `items` in consecutive batches of at most [`BATCH_CHUNK`] items and [`BATCH_BYTES`]
/// bytes, each with the offset of its first item.
pub(super) fn batch_chunks<T: Serialize>(items: &[T]) -> anyhow::Result<Vec<(usize, &[T])>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0usize);
    for (i, item) in items.iter().enumerate() {
        let len = serde_json::to_vec(item)?.len().saturating_add(1);
        if i > start && (i - start >= BATCH_CHUNK || bytes.saturating_add(len) > BATCH_BYTES) {
            out.push((start, &items[start..i]));
            (start, bytes) = (i, 0);
        }
        bytes = bytes.saturating_add(len);
    }
    if start < items.len() {
        out.push((start, &items[start..]));
    }
    Ok(out)
}

/// A refused chunk's error, its item named by where the user wrote it: the server
/// numbers the items of a chunk from 0 (`[3].mode`), the user reads `tasks.jsonl:5`
/// (lines from 1, as every error of the reader) or the file of `--each`. Says how many
/// sessions were submitted before, so the user can resume.
pub(super) fn batch_error(
    e: anyhow::Error,
    offset: usize,
    submitted: usize,
    items: &[Item],
) -> anyhow::Error {
    let e = match e.downcast::<ApiFailure>() {
        Ok(mut f) => {
            let at = f
                .field
                .as_deref()
                .and_then(|field| field.strip_prefix('['))
                .and_then(|rest| rest.split_once(']'))
                .and_then(|(n, tail)| Some((n.parse::<usize>().ok()?, tail.to_string())));
            match at.and_then(|(n, tail)| Some((items.get(n.checked_add(offset)?)?, tail))) {
                Some((item, tail)) => {
                    let tail = tail.trim_start_matches('.');
                    f.field = (!tail.is_empty()).then(|| tail.to_string());
                    anyhow::Error::new(f).context(item.origin.clone())
                }
                None => anyhow::Error::new(f),
            }
        }
        Err(e) => e,
    };
    if submitted > 0 {
        e.context(format!(
            "{submitted} sessions (the ids printed above) were submitted before this error"
        ))
    } else {
        e
    }
}

/// What the batch's listing shows of the sessions followed.
#[derive(Default, Debug, PartialEq)]
pub(super) struct Tally {
    pub(super) done: u64,
    pub(super) failed: u64,
    pub(super) running: u64,
    pub(super) tokens: u64,
    pub(super) cost_usd: Option<f64>,
}

impl Tally {
    /// `12/20 done · 2 failed · 3 running · 15234 tokens · $0.0123`
    pub(super) fn line(&self, total: usize) -> String {
        let cost = self
            .cost_usd
            .map(|c| format!(" · ${c:.4}"))
            .unwrap_or_default();
        format!(
            "{}/{total} done · {} failed · {} running · {} tokens{cost}",
            self.done, self.failed, self.running, self.tokens
        )
    }
}

/// Follow batch `batch_id` until every one of `ids` has finished (or `timeout`), with a
/// progress line; the completions seen.
pub(super) async fn wait(
    api: &Api,
    batch_id: &str,
    ids: &[String],
    timeout: Option<Duration>,
) -> anyhow::Result<HashMap<String, Completion>> {
    let wanted: HashSet<&str> = ids.iter().map(String::as_str).collect();
    let total = ids.len();
    let progress = Progress::new(total as u64, true, PLAIN_EVERY);
    progress.note(&format!("batch {batch_id}: {total} sessions"));
    let t0 = Instant::now();
    let deadline = timeout.map(|t| t0 + t);
    let (tally, results) = loop {
        let (tally, results) = read_batch(api, batch_id, &wanted).await?;
        progress.update(tally.done, &tally.line(total), t0.elapsed());
        if results.len() >= total || deadline.is_some_and(|d| Instant::now() >= d) {
            break (tally, results);
        }
        tokio::time::sleep(POLL_EVERY).await;
    };
    progress.finish();
    // The last line stays, terminal or not.
    eprintln!(
        "batch {batch_id}: {} ({:.1}s)",
        tally.line(total),
        t0.elapsed().as_secs_f64()
    );
    Ok(results)
}

/// One pass over the batch's listing: the tally of the sessions followed, and the
/// completions of those that finished.
async fn read_batch(
    api: &Api,
    batch_id: &str,
    wanted: &HashSet<&str>,
) -> anyhow::Result<(Tally, HashMap<String, Completion>)> {
    let mut tally = Tally::default();
    let mut results = HashMap::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/sessions?batch_id={}&limit={PAGE}", encode(batch_id));
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={}", encode(c)));
        }
        let page: ListResponse = api.get(&path).await?;
        if let Some(c) = page.cost_usd {
            tally.cost_usd = Some(tally.cost_usd.unwrap_or(0.0) + c);
        }
        for v in page
            .sessions
            .iter()
            .filter(|v| wanted.contains(v.id.as_str()))
        {
            tally.tokens = tally
                .tokens
                .saturating_add(v.usage.input_tokens)
                .saturating_add(v.usage.output_tokens);
            match v.status {
                SessionStatus::Running => tally.running = tally.running.saturating_add(1),
                SessionStatus::Failed => tally.failed = tally.failed.saturating_add(1),
                _ => {}
            }
            if let Some(c) = completion_from_view(v) {
                tally.done = tally.done.saturating_add(1);
                results.insert(v.id.clone(), c);
            }
        }
        match page.next_cursor {
            // A cursor that does not move would page forever.
            Some(next) if cursor.as_deref() != Some(next.as_str()) => cursor = Some(next),
            _ => break,
        }
    }
    Ok((tally, results))
}
