//! Forks, as both stores read and write them (see `agentq_types::fork` for what a step
//! is). A fork's row names its origin (`forked_from`) and how many of the origin's
//! messages its history starts with (`fork_at`); its own messages are stored under its
//! own id from position `fork_at` on. A history is read by walking the chain of origins in
//! one recursive statement, each link giving its messages below the position where the
//! next fork took over: nothing of a prefix is ever copied.
//!
//! `forked_from` always names the session whose own messages hold the fork's last shared
//! one (a fork inside its origin's prefix points at the origin's origin instead): then the
//! chain only grows by forks past their origin's fork point, and its length is bounded by
//! [`MAX_FORK_DEPTH`].

use std::sync::LazyLock;

use serde_json::value::RawValue;
use sqlx::types::Json;
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Type};

use agentq_agent::schema::Message;

use crate::fork::{ForkRefusal, ForkResult, MAX_FORK_DEPTH, NewFork};

use super::chain::{chain, chain_messages};
use super::escape::stored_json;
use super::record::SessionRecord;
use super::statements::{Dialect, Shared};

/// The stored history a claim of a fork resumes from (`$1`: the fork).
const HISTORY: Shared = Shared {
    text: concat!(
        chain!(),
        "SELECT m.seq, m.body FROM ",
        chain_messages!(),
        "ORDER BY m.seq"
    ),
    sqlite_now: None,
};

/// What finding a step needs of each message: its position, role, and how many tool
/// calls it made.
const STEPS: Shared = Shared {
    text: concat!(
        chain!(),
        "SELECT m.seq, m.body->>'role', \
         CAST(COALESCE(json_array_length(m.body->'tool_calls'), 0) AS integer) FROM ",
        chain_messages!(),
        "ORDER BY m.seq"
    ),
    sqlite_now: None,
};

/// The links of `$1`'s chain, itself first: id, origin, fork position.
const LINKS: Shared = Shared {
    text: concat!(chain!(), "SELECT id, origin, lo FROM chain ORDER BY depth"),
    sqlite_now: None,
};

/// A new fork's row made one: its origin and position, its history's length, and its
/// iteration count (where its per-turn allowance starts too).
const MARK: Shared = Shared {
    text: "UPDATE sessions SET forked_from = $2, fork_at = $3, history_len = $4, \
           iteration = $5, turn_base = $5 WHERE id = $1 RETURNING COLS",
    sqlite_now: None,
};

/// The fork's message after the prefix.
const MESSAGE: Shared = Shared {
    text: "INSERT INTO messages (root_id, session_id, seq, body) \
           VALUES ($1::uuid, $1::uuid, $2, $3::json)",
    sqlite_now: None,
};

/// The files of tree `$2` as of its root's history length `$3`, as the new tree `$1`'s:
/// each path's latest version from then, unless that deleted it.
const FILES: Shared = Shared {
    text: "INSERT INTO workspace_files (root_id, path, sha256, size, modified_at_seq) \
           SELECT $1, v.path, v.sha256, v.size, 0 FROM ( \
             SELECT path, sha256, size, row_number() OVER ( \
               PARTITION BY path ORDER BY step_len DESC, ver DESC) AS r \
             FROM workspace_versions WHERE root_id = $2 AND step_len <= $3) v \
           WHERE v.r = 1 AND v.sha256 IS NOT NULL",
    sqlite_now: None,
};

/// The new tree's files as its versions at its fork position `$2` (a fork of the fork
/// finds them there).
const VERSIONS: Shared = Shared {
    text: "INSERT INTO workspace_versions (root_id, path, sha256, size, step_len) \
           SELECT root_id, path, sha256, size, $2 FROM workspace_files WHERE root_id = $1",
    sqlite_now: None,
};

/// The fork statements, rendered for one dialect.
pub(crate) struct ForkStatements {
    pub history: String,
    pub steps: String,
    pub links: String,
    pub mark: String,
    pub message: String,
    pub files: String,
    pub versions: String,
}

impl ForkStatements {
    fn new(d: Dialect) -> Self {
        ForkStatements {
            history: HISTORY.render(d),
            steps: STEPS.render(d),
            links: LINKS.render(d),
            mark: MARK.render(d),
            message: MESSAGE.render(d),
            files: FILES.render(d),
            versions: VERSIONS.render(d),
        }
    }
}

pub(crate) static POSTGRES: LazyLock<ForkStatements> =
    LazyLock::new(|| ForkStatements::new(Dialect::Postgres));
pub(crate) static SQLITE: LazyLock<ForkStatements> =
    LazyLock::new(|| ForkStatements::new(Dialect::Sqlite));

/// A message as [`locate`] reads it: position, role, tool calls made.
pub(crate) type Step = (i32, Option<String>, i32);

/// A chain link as [`origin_of`] reads it: id, origin, fork position.
pub(crate) type Link = (String, Option<String>, Option<i32>);

/// The history length at which iteration `k` ends: right after the `k`-th assistant
/// message and the tool results that follow it, one per call (0: the prompt alone).
pub(crate) fn locate(steps: &[Step], k: u32) -> Result<i32, ForkRefusal> {
    if k == 0 {
        return Ok(1);
    }
    let assistants: Vec<usize> = steps
        .iter()
        .enumerate()
        .filter(|(_, s)| s.1.as_deref() == Some("assistant"))
        .map(|(i, _)| i)
        .collect();
    let iterations = u32::try_from(assistants.len()).unwrap_or(u32::MAX);
    let Some(&i) = usize::try_from(k - 1).ok().and_then(|i| assistants.get(i)) else {
        return Err(ForkRefusal::PastEnd { iterations });
    };
    let (seq, _, calls) = &steps[i];
    let mut end = seq.saturating_add(1);
    let mut results = 0;
    for (s, role, _) in &steps[i + 1..] {
        if results >= *calls || *s != end || role.as_deref() != Some("tool") {
            break;
        }
        results += 1;
        end = end.saturating_add(1);
    }
    if results < *calls {
        return Err(ForkRefusal::Unfinished { at: k });
    }
    Ok(end)
}

/// The session a fork at history length `at` of `links[0]` reads its prefix from (the
/// first link whose own messages reach below `at`), if the new fork keeps the chain within
/// [`MAX_FORK_DEPTH`].
pub(crate) fn origin_of(links: &[Link], at: i32) -> Result<String, ForkRefusal> {
    let mut i = 0;
    while let Some((_, Some(_), Some(lo))) = links.get(i) {
        if at > *lo {
            break;
        }
        i += 1;
    }
    let Some((id, _, _)) = links.get(i) else {
        return Err(ForkRefusal::TooDeep);
    };
    // The links past `i` are its origins: the new fork adds one.
    let depth = links.len().saturating_sub(i);
    if depth > MAX_FORK_DEPTH as usize {
        return Err(ForkRefusal::TooDeep);
    }
    Ok(id.clone())
}

/// What [`plan`] found: the history length the fork starts from, and the session whose
/// messages it reads up to there (and whose tree's files it starts with).
pub(crate) struct Plan {
    pub at: i32,
    pub from: String,
    /// The origin's prompt: message 0 of every history is its spec's prompt, so the fork's
    /// spec holds the origin's whatever it was given.
    pub prompt: String,
}

/// Where a fork of `f` starts, read on `conn`, or why it cannot: the origin must be a root
/// of `f`'s tenant (else `None`: not found).
pub(crate) async fn plan<DB>(
    conn: &mut DB::Connection,
    select_session: &str,
    sql: &ForkStatements,
    f: &NewFork,
) -> crate::error::Result<Result<Plan, ForkResult>>
where
    DB: Database,
    for<'r> SessionRecord: FromRow<'r, DB::Row>,
    for<'r> Step: FromRow<'r, DB::Row>,
    for<'r> Link: FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let origin: Option<SessionRecord> = sqlx::query_as::<DB, SessionRecord>(select_session)
        .bind(f.origin.as_str())
        .fetch_optional(&mut *conn)
        .await?;
    let Some(origin) = origin.filter(|o| o.tenant == f.new.tenant) else {
        return Ok(Err(ForkResult::NotFound));
    };
    if origin.parent_id.is_some() {
        return Ok(Err(ForkResult::Refused(ForkRefusal::NotRoot)));
    }
    let steps: Vec<Step> = sqlx::query_as::<DB, Step>(&sql.steps)
        .bind(f.origin.as_str())
        .fetch_all(&mut *conn)
        .await?;
    let links: Vec<Link> = sqlx::query_as::<DB, Link>(&sql.links)
        .bind(f.origin.as_str())
        .fetch_all(&mut *conn)
        .await?;
    let at = match locate(&steps, f.at_iteration) {
        Ok(at) => at,
        Err(refused) => return Ok(Err(ForkResult::Refused(refused))),
    };
    let planned = origin_of(&links, at).map(|from| Plan {
        at,
        from,
        prompt: origin.spec.0.prompt,
    });
    Ok(planned.map_err(ForkResult::Refused))
}

/// Make the just-inserted session `f.new` the fork `p` planned, inside the caller's
/// transaction: its row, its message, its files. Its row as it now is.
pub(crate) async fn write<DB>(
    conn: &mut DB::Connection,
    sql: &ForkStatements,
    f: &NewFork,
    p: &Plan,
) -> crate::error::Result<SessionRecord>
where
    DB: Database,
    for<'r> SessionRecord: FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> i32: Encode<'q, DB> + Type<DB>,
    for<'q> Json<Box<RawValue>>: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let id = f.new.id.as_str();
    let len = if f.message.is_some() {
        p.at.saturating_add(1)
    } else {
        p.at
    };
    let iteration = i32::try_from(f.at_iteration).unwrap_or(i32::MAX);
    let rec = sqlx::query_as::<DB, SessionRecord>(&sql.mark)
        .bind(id)
        .bind(p.from.as_str())
        .bind(p.at)
        .bind(len)
        .bind(iteration)
        .fetch_one(&mut *conn)
        .await?;
    if let Some(text) = &f.message {
        sqlx::query::<DB>(&sql.message)
            .bind(id)
            .bind(p.at)
            .bind(stored_json(&Message::user(text))?)
            .execute(&mut *conn)
            .await?;
    }
    sqlx::query::<DB>(&sql.files)
        .bind(id)
        .bind(p.from.as_str())
        .bind(p.at)
        .execute(&mut *conn)
        .await?;
    sqlx::query::<DB>(&sql.versions)
        .bind(id)
        .bind(p.at)
        .execute(&mut *conn)
        .await?;
    Ok(rec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(seq: i32, role: &str, calls: i32) -> Step {
        (seq, Some(role.to_string()), calls)
    }

    #[test]
    fn an_iteration_ends_after_its_tool_results() {
        // prompt (seq 0 not stored), a1 (2 calls), t, t, steer, a2 (0 calls)
        let h = [
            step(1, "assistant", 2),
            step(2, "tool", 0),
            step(3, "tool", 0),
            step(4, "user", 0),
            step(5, "assistant", 0),
        ];
        assert_eq!(locate(&h, 0), Ok(1));
        assert_eq!(locate(&h, 1), Ok(4));
        assert_eq!(locate(&h, 2), Ok(6));
        assert_eq!(locate(&h, 3), Err(ForkRefusal::PastEnd { iterations: 2 }));
        assert_eq!(locate(&h[..2], 1), Err(ForkRefusal::Unfinished { at: 1 }));
    }

    #[test]
    fn a_fork_inside_its_origins_prefix_points_past_it() {
        let links = vec![
            ("c".to_string(), Some("b".to_string()), Some(10)),
            ("b".to_string(), Some("a".to_string()), Some(5)),
            ("a".to_string(), None, None),
        ];
        assert_eq!(origin_of(&links, 11), Ok("c".to_string()));
        assert_eq!(origin_of(&links, 10), Ok("b".to_string()));
        assert_eq!(origin_of(&links, 6), Ok("b".to_string()));
        assert_eq!(origin_of(&links, 5), Ok("a".to_string()));
        assert_eq!(origin_of(&links, 1), Ok("a".to_string()));
        let deep: Vec<Link> = (0..=MAX_FORK_DEPTH)
            .map(|i| {
                (
                    format!("s{i}"),
                    Some(format!("s{}", i + 1)),
                    Some(100 - i as i32),
                )
            })
            .chain([("root".to_string(), None, None)])
            .collect();
        assert_eq!(origin_of(&deep, 200), Err(ForkRefusal::TooDeep));
        assert_eq!(origin_of(&deep, 1), Ok("root".to_string()));
    }
}
