//! What the scheduler's integration tests share: a scheduler served in process on a
//! fresh store ([`served`]), the bounded wait for what announces nothing, an HTTP client
//! with a key, reading an answer, and this process's memory figures. Each test binary
//! uses a part of this.
#![allow(dead_code)]

use std::fmt::{Debug, Display};
use std::future::Future;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

pub mod served;

#[allow(unused_imports)]
pub use served::{ADMIN_KEY, Backend, Served};

/// What a check of [`wait_until`] found: ready with a value, or not yet (with what it saw,
/// for the message if the wait runs out).
pub trait Ready {
    type Output;
    fn ready(self) -> Result<Self::Output, String>;
}

impl Ready for bool {
    type Output = ();
    fn ready(self) -> Result<(), String> {
        if self { Ok(()) } else { Err("not yet".into()) }
    }
}

impl<T> Ready for Option<T> {
    type Output = T;
    fn ready(self) -> Result<T, String> {
        self.ok_or_else(|| "nothing yet".into())
    }
}

impl<T, E: Debug> Ready for Result<T, E> {
    type Output = T;
    fn ready(self) -> Result<T, String> {
        self.map_err(|seen| format!("{seen:?}"))
    }
}

/// Poll `check` until it is [`Ready`], for a state that announces nothing; panics naming
/// `what` and the last thing seen if `limit` passes first. Checks often at first, then
/// every 100 ms.
pub async fn wait_until<R: Ready, F: Future<Output = R>>(
    what: impl Display,
    limit: Duration,
    mut check: impl FnMut() -> F,
) -> R::Output {
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_millis(10);
    loop {
        match check().await.ready() {
            Ok(v) => return v,
            Err(seen) => assert!(
                Instant::now() < deadline,
                "timed out after {limit:?} waiting for {what}; last seen: {seen}"
            ),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// A client that sends `key` as its bearer token on every request.
pub fn bearer_client(key: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {key}").parse().unwrap(),
    );
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap()
}

/// An answer's status and body (JSON, or the text as a JSON string).
pub async fn read(r: reqwest::Response) -> (u16, Value) {
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, v)
}

/// A figure of `/proc/self/status` in kB (`key` with its colon: `VmRSS:`).
pub fn status_kb(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /proc/self/status"))
}

/// The high-water mark from now on, starting at what is resident now (kB).
pub fn reset_peak() -> u64 {
    let now = status_kb("VmRSS:");
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    now
}
