//! `agentq retry`: redrive failed sessions through `POST /v1/sessions/{id}/retry`, by id,
//! or with `--failed` every session of the caller's tenant that failed with an error
//! (found by listing `status=failed`), narrowed by `--since` (finished at or after a time,
//! or within a duration like `1h`) and `--reason` (a substring of the error). Prints each
//! session retried; a session the server refuses is reported and the rest go on.

use std::process::ExitCode;

use anyhow::bail;
use chrono::{DateTime, Utc};
use clap::Args;
use serde_json::json;

use agentq_agent::spec::ExitReason;
use agentq_api::{ListResponse, RetryResponse, SessionView};

use crate::client::api::{Api, ApiArgs, ApiFailure, encode};

/// Sessions per listing page.
const PAGE: u32 = 500;

#[derive(Args, Debug)]
pub struct RetryArgs {
    /// Sessions to retry.
    pub ids: Vec<String>,
    /// Retry every session that failed with an error.
    #[arg(long)]
    pub failed: bool,
    /// With --failed: only sessions that finished at or after this time (RFC 3339, e.g.
    /// 2026-01-31T12:00:00Z) or within this duration (e.g. 90s, 30m, 1h, 2d).
    #[arg(long, requires = "failed")]
    pub since: Option<String>,
    /// With --failed: only sessions whose error contains this text.
    #[arg(long, requires = "failed")]
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

/// Whether a listed session is one `--failed` asks for.
pub fn matches(s: &SessionView, since: Option<DateTime<Utc>>, reason: Option<&str>) -> bool {
    s.finish_reason == Some(ExitReason::Error)
        && since.is_none_or(|t| s.finished_at.is_some_and(|f| f >= t))
        && reason.is_none_or(|r| s.error.as_deref().is_some_and(|e| e.contains(r)))
}

/// `agentq retry`
pub async fn retry(args: RetryArgs) -> anyhow::Result<ExitCode> {
    if args.failed && !args.ids.is_empty() {
        bail!("--failed: give either session ids or --failed, not both");
    }
    if !args.failed && args.ids.is_empty() {
        bail!("give the ids of the sessions to retry, or --failed for every failed one");
    }
    let since = args
        .since
        .as_deref()
        .map(|v| parse_since(v, Utc::now()))
        .transpose()?;
    let api = Api::new(&args.api)?;
    let ids = if args.failed {
        let found = failed(&api, since, args.reason.as_deref()).await?;
        if found.is_empty() {
            println!("no failed session matched");
            return Ok(ExitCode::SUCCESS);
        }
        found
    } else {
        args.ids
    };
    let mut refused = 0usize;
    for id in &ids {
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

/// Every session of the caller's tenant that failed with an error and matches, oldest
/// first (so a redrive runs them in the order they were submitted).
async fn failed(
    api: &Api,
    since: Option<DateTime<Utc>>,
    reason: Option<&str>,
) -> anyhow::Result<Vec<String>> {
    let mut ids = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/sessions?status=failed&limit={PAGE}");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={}", encode(c)));
        }
        let page: ListResponse = api.get(&path).await?;
        ids.extend(
            page.sessions
                .iter()
                .filter(|s| matches(s, since, reason))
                .map(|s| s.id.clone()),
        );
        match page.next_cursor {
            // A cursor that does not move would page forever.
            Some(next) if cursor.as_deref() != Some(next.as_str()) => cursor = Some(next),
            _ => break,
        }
    }
    ids.reverse();
    Ok(ids)
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
