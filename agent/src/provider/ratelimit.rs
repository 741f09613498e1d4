//! The rate-limit state a provider announces with its answers: OpenAI's `x-ratelimit-*`
//! headers, Anthropic's `anthropic-ratelimit-*` ones. Neutral, like the rest of this
//! folder's boundary: the admission side reads it without knowing whose headers it was.
//!
//! The headers come from whatever endpoint a session points at, so every value is parsed
//! defensively: numbers that do not parse are dropped, and every reset is capped at
//! [`MAX_RESET`] so that a hostile or broken server cannot hold a key for days.

use std::time::Duration;

use reqwest::header::HeaderMap;
use serde::{Deserialize, Serialize};

/// The longest reset taken from a header: OpenAI's and Anthropic's windows are a minute
/// (daily token windows aside); anything longer is held for at most this long and then
/// learned again from the next answer.
pub const MAX_RESET: Duration = Duration::from_secs(3600);

/// What one answer said about the key's limits. Every field is optional: servers send
/// any subset, and compatible servers often none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimitInfo {
    /// Requests allowed per window.
    pub limit_requests: Option<u64>,
    /// Requests left in the current window.
    pub remaining_requests: Option<u64>,
    /// Until the request window is full again.
    pub reset_requests: Option<Duration>,
    /// Tokens allowed per window (input and output together, or the provider's own sum).
    pub limit_tokens: Option<u64>,
    /// Tokens left in the current window.
    pub remaining_tokens: Option<u64>,
    /// Until the token window is full again.
    pub reset_tokens: Option<Duration>,
}

impl RateLimitInfo {
    /// Nothing was announced.
    pub fn is_empty(&self) -> bool {
        *self == RateLimitInfo::default()
    }

    /// OpenAI's headers (and those of the compatible servers that copy them):
    /// `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, resets as Go-style
    /// durations (`6m0s`, `1s`, `20ms`, `59.89s`) or plain seconds.
    pub fn from_openai_headers(headers: &HeaderMap) -> Self {
        let num = |name: &str| header(headers, name).and_then(parse_count);
        let reset = |name: &str| header(headers, name).and_then(parse_go_duration);
        RateLimitInfo {
            limit_requests: num("x-ratelimit-limit-requests"),
            remaining_requests: num("x-ratelimit-remaining-requests"),
            reset_requests: reset("x-ratelimit-reset-requests"),
            limit_tokens: num("x-ratelimit-limit-tokens"),
            remaining_tokens: num("x-ratelimit-remaining-tokens"),
            reset_tokens: reset("x-ratelimit-reset-tokens"),
        }
    }

    /// Anthropic's headers: `anthropic-ratelimit-requests-{limit,remaining,reset}` and the
    /// same for `tokens`, `input-tokens` and `output-tokens`, resets as RFC 3339 times.
    /// The token fields take the combined `tokens-*` family when sent, else whichever of
    /// input and output tokens has the smaller share left (the one that binds first).
    pub fn from_anthropic_headers(headers: &HeaderMap) -> Self {
        Self::from_anthropic_headers_at(headers, chrono::Utc::now())
    }

    /// [`RateLimitInfo::from_anthropic_headers`] with resets measured from `now`.
    pub fn from_anthropic_headers_at(
        headers: &HeaderMap,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Self {
        let family = |name: &str| {
            let get = |part: &str| header(headers, &format!("anthropic-ratelimit-{name}-{part}"));
            Family {
                limit: get("limit").and_then(parse_count),
                remaining: get("remaining").and_then(parse_count),
                reset: get("reset").and_then(|v| parse_rfc3339_reset(v, now)),
            }
        };
        let requests = family("requests");
        let tokens = [
            family("tokens"),
            family("input-tokens"),
            family("output-tokens"),
        ];
        let tokens = if tokens[0].is_some() {
            tokens[0]
        } else {
            tokens[1..]
                .iter()
                .copied()
                .filter(Family::is_some)
                .min_by(|a, b| a.share_left().total_cmp(&b.share_left()))
                .unwrap_or_default()
        };
        RateLimitInfo {
            limit_requests: requests.limit,
            remaining_requests: requests.remaining,
            reset_requests: requests.reset,
            limit_tokens: tokens.limit,
            remaining_tokens: tokens.remaining,
            reset_tokens: tokens.reset,
        }
    }

    /// How long until the key can take a call again, when the answer says it cannot now
    /// (a remaining count at zero): the reset of the exhausted window, the longer one when
    /// both are.
    pub fn exhausted_for(&self) -> Option<Duration> {
        let requests = (self.remaining_requests == Some(0))
            .then(|| self.reset_requests.unwrap_or(Duration::from_secs(1)));
        let tokens = (self.remaining_tokens == Some(0))
            .then(|| self.reset_tokens.unwrap_or(Duration::from_secs(1)));
        match (requests, tokens) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }
}

/// One `limit`/`remaining`/`reset` triple.
#[derive(Debug, Clone, Copy, Default)]
struct Family {
    limit: Option<u64>,
    remaining: Option<u64>,
    reset: Option<Duration>,
}

impl Family {
    fn is_some(&self) -> bool {
        self.limit.is_some() || self.remaining.is_some() || self.reset.is_some()
    }

    /// The share of the window left (1 when unknown).
    fn share_left(&self) -> f64 {
        match (self.limit, self.remaining) {
            (Some(l), Some(r)) if l > 0 => r as f64 / l as f64,
            (_, Some(0)) => 0.0,
            _ => 1.0,
        }
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

/// A count: a non-negative integer (some servers send `"100.0"`; fractions are dropped).
fn parse_count(v: &str) -> Option<u64> {
    if let Ok(n) = v.parse::<u64>() {
        return Some(n);
    }
    let f = v.parse::<f64>().ok()?;
    (f.is_finite() && f >= 0.0).then(|| f.min(u64::MAX as f64) as u64)
}

/// A Go `time.Duration` string as OpenAI sends it (`1h2m3.5s`, `6m0s`, `20ms`, `1.5µs`),
/// or plain seconds (`"1"`, `"0.5"`). Capped at [`MAX_RESET`].
pub fn parse_go_duration(v: &str) -> Option<Duration> {
    let v = v.trim();
    if v.is_empty() {
        return None;
    }
    if let Ok(secs) = v.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0)
            .then(|| Duration::from_secs_f64(secs.min(MAX_RESET.as_secs_f64())));
    }
    let mut total = 0f64;
    let mut rest = v;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_end == 0 {
            return None;
        }
        let n: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" | "μs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        rest = &rest[unit_end..];
        total += n * scale;
        if !total.is_finite() {
            return None;
        }
    }
    Some(Duration::from_secs_f64(total.min(MAX_RESET.as_secs_f64())))
}

/// An RFC 3339 instant as the time left until it from `now` (zero when past), capped at
/// [`MAX_RESET`].
fn parse_rfc3339_reset(v: &str, now: chrono::DateTime<chrono::Utc>) -> Option<Duration> {
    let when = chrono::DateTime::parse_from_rfc3339(v).ok()?;
    let left = when.with_timezone(&chrono::Utc).signed_duration_since(now);
    Some(left.to_std().unwrap_or(Duration::ZERO).min(MAX_RESET))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use reqwest::header::{HeaderName, HeaderValue};

    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn go_durations() {
        let ms = |n| Some(Duration::from_millis(n));
        assert_eq!(parse_go_duration("6m0s"), ms(360_000));
        assert_eq!(parse_go_duration("1s"), ms(1000));
        assert_eq!(parse_go_duration("20ms"), ms(20));
        assert_eq!(parse_go_duration("59.89s"), ms(59_890));
        assert_eq!(parse_go_duration("1m30.5s"), ms(90_500));
        assert_eq!(parse_go_duration("0.5"), ms(500));
        assert_eq!(parse_go_duration("2"), ms(2000));
        assert_eq!(parse_go_duration("100h"), Some(MAX_RESET), "capped");
        assert_eq!(parse_go_duration("1e308"), Some(MAX_RESET), "capped");
        for bad in ["", "s", "5x", "-1s", "-3", "1..2s", "NaN", "inf", "1s2"] {
            assert_eq!(parse_go_duration(bad), None, "{bad:?}");
        }
        // Huge digit strings stay bounded instead of overflowing.
        let long = format!("{}h", "9".repeat(400));
        assert!(parse_go_duration(&long).is_none_or(|d| d <= MAX_RESET));
    }

    #[test]
    fn openai_headers() {
        let h = headers(&[
            ("x-ratelimit-limit-requests", "60"),
            ("x-ratelimit-limit-tokens", "150000"),
            ("x-ratelimit-remaining-requests", "59"),
            ("x-ratelimit-remaining-tokens", "149984"),
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ]);
        let info = RateLimitInfo::from_openai_headers(&h);
        assert_eq!(
            info,
            RateLimitInfo {
                limit_requests: Some(60),
                remaining_requests: Some(59),
                reset_requests: Some(Duration::from_secs(1)),
                limit_tokens: Some(150_000),
                remaining_tokens: Some(149_984),
                reset_tokens: Some(Duration::from_secs(360)),
            }
        );
        assert_eq!(info.exhausted_for(), None);
        assert!(RateLimitInfo::from_openai_headers(&HeaderMap::new()).is_empty());
    }

    #[test]
    fn garbage_values_are_dropped() {
        let h = headers(&[
            ("x-ratelimit-limit-requests", "lots"),
            ("x-ratelimit-remaining-requests", "-4"),
            ("x-ratelimit-reset-requests", "soon"),
            ("x-ratelimit-remaining-tokens", "0"),
        ]);
        let info = RateLimitInfo::from_openai_headers(&h);
        assert_eq!(info.limit_requests, None);
        assert_eq!(info.remaining_requests, None);
        assert_eq!(info.reset_requests, None);
        assert_eq!(info.remaining_tokens, Some(0));
        // Exhausted with no reset known: a short hold, not forever.
        assert_eq!(info.exhausted_for(), Some(Duration::from_secs(1)));
    }

    #[test]
    fn anthropic_recorded_429_headers() {
        // Header values of a recorded 2024 Anthropic 429 (requests exhausted).
        let h = headers(&[
            ("anthropic-ratelimit-requests-limit", "5"),
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "2024-03-26T20:00:00Z"),
            ("anthropic-ratelimit-tokens-limit", "25000"),
            ("anthropic-ratelimit-tokens-remaining", "16000"),
            ("anthropic-ratelimit-tokens-reset", "2024-03-26T20:00:00Z"),
        ]);
        let now = chrono::DateTime::parse_from_rfc3339("2024-03-26T19:59:59Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        let info = RateLimitInfo::from_anthropic_headers_at(&h, now);
        assert_eq!(info.limit_requests, Some(5));
        assert_eq!(info.remaining_requests, Some(0));
        assert_eq!(info.reset_requests, Some(Duration::from_secs(1)));
        assert_eq!(info.limit_tokens, Some(25_000));
        assert_eq!(info.remaining_tokens, Some(16_000));
        assert_eq!(info.exhausted_for(), Some(Duration::from_secs(1)));
        // Read later, the reset is past: zero, never negative.
        let later = RateLimitInfo::from_anthropic_headers(&h);
        assert_eq!(later.reset_requests, Some(Duration::ZERO));
    }

    #[test]
    fn anthropic_input_output_tokens_take_the_tighter() {
        let now = chrono::Utc::now();
        let at = |s: i64| (now + chrono::Duration::seconds(s)).to_rfc3339();
        let (r1, r2, far) = (at(10), at(20), at(1_000_000));
        let h = headers(&[
            ("anthropic-ratelimit-input-tokens-limit", "1000"),
            ("anthropic-ratelimit-input-tokens-remaining", "900"),
            ("anthropic-ratelimit-input-tokens-reset", &r1),
            ("anthropic-ratelimit-output-tokens-limit", "100"),
            ("anthropic-ratelimit-output-tokens-remaining", "5"),
            ("anthropic-ratelimit-output-tokens-reset", &r2),
            ("anthropic-ratelimit-requests-reset", &far),
        ]);
        let info = RateLimitInfo::from_anthropic_headers_at(&h, now);
        assert_eq!(info.limit_tokens, Some(100));
        assert_eq!(info.remaining_tokens, Some(5));
        assert_eq!(info.reset_tokens, Some(Duration::from_secs(20)));
        assert_eq!(info.reset_requests, Some(MAX_RESET), "capped");
        let bad = headers(&[("anthropic-ratelimit-requests-reset", "tomorrow")]);
        assert!(RateLimitInfo::from_anthropic_headers(&bad).is_empty());
    }
}
