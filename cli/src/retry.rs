//! `agentq retry`: redrive sessions that failed with an error, from their last
//! checkpoint: by id (`POST /v1/sessions/{id}/retry` each), or by filter with one server
//! route (`POST /v1/sessions/retry`, a page at a time): `--failed` every such session of
//! the caller's tenant, `--batch` those of a batch, narrowed by `--since` (finished at or
//! after a time, or within a duration like `1h`) and `--reason` (a substring of the
//! error). Prints each session retried; by id, a session the server refuses is reported
//! and the rest go on.

use std::process::ExitCode;

use anyhow::bail;
use chrono::{DateTime, Utc};
use clap::{ArgGroup, Args};
use serde_json::json;

use agentq_api::{BulkRetryResponse, RetryResponse, SessionFilter};

use crate::client::api::{Api, ApiArgs, ApiFailure, encode};

const EXAMPLES: &str = "Examples:
  agentq retry 0190c2d4-5e6f-7a8b-9c0d-1e2f3a4b5c6d
  agentq retry --batch 0190c2d4-5e6f-7a8b-9c0d-1e2f3a4b5c6d
  agentq retry --batch 0190c2d4-5e6f-7a8b-9c0d-1e2f3a4b5c6d --reason 'rate limit' --since 1h
  agentq retry --failed --since 2026-01-31T12:00:00Z";

#[derive(Args, Debug)]
#[command(after_help = EXAMPLES, group(ArgGroup::new("by_filter").args(["failed", "batch"]).multiple(true)))]
pub struct RetryArgs {
    /// Sessions to retry.
    #[arg(conflicts_with = "by_filter")]
    pub ids: Vec<String>,
    /// Retry every session that failed with an error.
    #[arg(long)]
    pub failed: bool,
    /// Retry the sessions of this batch that failed with an error.
    #[arg(long, value_name = "ID")]
    pub batch: Option<String>,
    /// With --failed or --batch: only sessions that finished at or after this time (RFC
    /// 3339, e.g. 2026-01-31T12:00:00Z) or within this duration (e.g. 90s, 30m, 1h, 2d).
    #[arg(long, requires = "by_filter")]
    pub since: Option<String>,
    /// With --failed or --batch: only sessions whose error contains this text.
    #[arg(long, requires = "by_filter")]
    pub reason: Option<String>,
    #[command(flatten)]
    pub api: ApiArgs,
}

/// `--since` as a point in time: an RFC 3339 time, or a duration before `now`.
pub fn parse_since(v: &str, now: DateTime<Utc>) -> anyhow::Result<DateTime<Utc>> {
    let v = v.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(v) {
        return Ok(t.with_timezone(&Utc));
    }
    let bad = || {
        anyhow::anyhow!(
            "--since: expected an RFC 3339 time (2026-01-31T12:00:00Z) or a duration like \
             90s, 30m, 1h or 2d, got {v:?}"
        )
    };
    let split = v.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (n, unit) = v.split_at(split);
    let n: i64 = n.parse().map_err(|_| bad())?;
    let secs_per = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    let secs = n.checked_mul(secs_per).ok_or_else(bad)?;
    let d = chrono::TimeDelta::try_seconds(secs).ok_or_else(bad)?;
    now.checked_sub_signed(d).ok_or_else(bad)
}

/// `agentq retry`
pub async fn retry(args: RetryArgs) -> anyhow::Result<ExitCode> {
    let by_filter = args.failed || args.batch.is_some();
    if !by_filter && args.ids.is_empty() {
        bail!(
            "give the ids of the sessions to retry, --batch ID, or --failed for every failed one"
        );
    }
    let since = args
        .since
        .as_deref()
        .map(|v| parse_since(v, Utc::now()))
        .transpose()?;
    let api = Api::new(&args.api)?;
    if by_filter {
        let filter = SessionFilter {
            batch_id: args.batch.clone(),
            error_contains: args.reason.clone(),
            finished_since: since,
            ..SessionFilter::default()
        };
        return by_filter_retry(&api, filter).await;
    }
    let mut refused = 0usize;
    for id in &args.ids {
        let answer: anyhow::Result<(u16, RetryResponse)> = api
            .post(&format!("/v1/sessions/{}/retry", encode(id)), &json!({}))
            .await;
        match answer {
            Ok((_, r)) => println!("retried {} ({})", r.id, r.status),
            Err(e) => match e.downcast_ref::<ApiFailure>() {
                Some(f) => {
                    refused = refused.saturating_add(1);
                    eprintln!("agentq: {id}: {}", f.message);
                }
                None => return Err(e),
            },
        }
    }
    Ok(if refused == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Every page of `POST /v1/sessions/retry` for `filter`.
async fn by_filter_retry(api: &Api, mut filter: SessionFilter) -> anyhow::Result<ExitCode> {
    let mut retried = 0usize;
    loop {
        let (_, page): (u16, BulkRetryResponse) = api.post("/v1/sessions/retry", &filter).await?;
        for r in &page.sessions {
            println!("retried {} ({})", r.id, r.status);
        }
        retried = retried.saturating_add(page.sessions.len());
        match page.next_cursor {
            // A cursor that does not move would page forever.
            Some(next) if filter.cursor.as_deref() != Some(next.as_str()) => {
                filter.cursor = Some(next);
            }
            _ => break,
        }
    }
    if retried == 0 {
        println!("no failed session matched");
    } else {
        eprintln!("{retried} sessions retried");
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_a_time_or_a_duration() {
        let now = DateTime::parse_from_rfc3339("2026-01-31T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(
            parse_since("2026-01-30T00:00:00+00:00", now).unwrap(),
            DateTime::parse_from_rfc3339("2026-01-30T00:00:00Z").unwrap()
        );
        assert_eq!(
            parse_since("90s", now).unwrap(),
            now - chrono::TimeDelta::seconds(90)
        );
        assert_eq!(
            parse_since("1h", now).unwrap(),
            now - chrono::TimeDelta::hours(1)
        );
        assert_eq!(
            parse_since("2d", now).unwrap(),
            now - chrono::TimeDelta::days(2)
        );
        for bad in [
            "",
            "h",
            "1w",
            "-1h",
            "1.5h",
            "yesterday",
            "99999999999999999999d",
        ] {
            let e = parse_since(bad, now).unwrap_err().to_string();
            assert!(e.starts_with("--since:"), "{bad}: {e}");
        }
    }
}
