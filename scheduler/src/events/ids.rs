//! Event ids: stream entry ids, and where a reconnecting client stopped.

/// A Redis stream entry id `<ms>-<n>`, ordered numerically.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct StreamId(pub u64, pub u64);

impl StreamId {
    pub fn parse(s: &str) -> Option<StreamId> {
        let (ms, n) = s.split_once('-').unwrap_or((s, "0"));
        Some(StreamId(ms.parse().ok()?, n.parse().ok()?))
    }
}

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.0, self.1)
    }
}

/// Where a reconnecting client stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LastId {
    /// An entry of the session's stream.
    Stream(StreamId),
    /// An event rebuilt from the transcript: `t-<seq>-<k>`.
    Transcript(u64, u64),
}

impl LastId {
    pub fn parse(s: &str) -> Option<LastId> {
        let s = s.trim();
        if let Some(rest) = s.strip_prefix("t-") {
            let (seq, k) = rest.split_once('-')?;
            return Some(LastId::Transcript(seq.parse().ok()?, k.parse().ok()?));
        }
        StreamId::parse(s).map(LastId::Stream)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn ids_parse() {
        assert_eq!(StreamId::parse("17-3"), Some(StreamId(17, 3)));
        assert_eq!(StreamId::parse("17"), Some(StreamId(17, 0)));
        assert!(StreamId::parse("x-1").is_none());
        assert!(StreamId(2, 0) > StreamId(1, 99));
        assert_eq!(LastId::parse("t-4-2"), Some(LastId::Transcript(4, 2)));
        assert_eq!(
            LastId::parse(" 1700000000000-5 "),
            Some(LastId::Stream(StreamId(1_700_000_000_000, 5)))
        );
        assert!(LastId::parse("t-4").is_none());
        assert!(LastId::parse("").is_none());
    }
}
