//! Reply parsing. Tolerant by design: RESP2 arrays and RESP3 maps both parse, and
//! anything malformed is skipped rather than failing the whole read.

use std::collections::HashMap;

use redis::Value;

use crate::queue::{Delivery, EventRecord};
use agentq_types::model::EnqueueReason;

// ---------------------------------------------------------------------------------------

/// One stream entry; `fields` is `None` for an entry that was deleted while pending.
pub(super) struct Entry {
    pub id: String,
    pub fields: Option<HashMap<String, String>>,
}

impl Entry {
    /// A delivery, or the entry id back when the entry has no usable session id.
    pub(super) fn into_delivery(self, queue: &str) -> std::result::Result<Delivery, String> {
        let Some(mut fields) = self.fields else {
            return Err(self.id);
        };
        match fields.remove("session_id") {
            Some(session_id) if !session_id.is_empty() => Ok(Delivery {
                queue: queue.to_string(),
                entry_id: self.id,
                session_id,
                reason: EnqueueReason::parse(fields.get("reason").map_or("new", String::as_str)),
            }),
            _ => Err(self.id),
        }
    }
}

/// A stored event; entries missing a field are skipped.
pub(super) fn event_record(session_id: &str, entry: Entry) -> Option<EventRecord> {
    let fields = entry.fields?;
    let num = |k: &str| fields.get(k).and_then(|v| v.parse::<i64>().ok());
    Some(EventRecord {
        session_id: session_id.to_string(),
        id: entry.id,
        seq: u64::try_from(num("seq")?).unwrap_or(0),
        epoch: num("epoch")?,
        data: fields.get("data")?.clone(),
    })
}

/// `XREADGROUP` reply → `(stream, entries)`; nil (timeout) → nothing.
pub(super) fn stream_entries(reply: Value) -> Vec<(String, Vec<Entry>)> {
    let per_stream: Vec<(Value, Value)> = match reply {
        Value::Map(pairs) => pairs,
        Value::Array(items) => items
            .into_iter()
            .filter_map(|item| {
                let mut kv = value_items(item).into_iter();
                Some((kv.next()?, kv.next()?))
            })
            .collect(),
        _ => Vec::new(),
    };
    per_stream
        .into_iter()
        .filter_map(|(name, entries)| Some((value_string(&name)?, parse_entries(entries))))
        .collect()
}

/// `[[id, [field, value, …] | nil], …]` → entries.
pub(super) fn parse_entries(entries: Value) -> Vec<Entry> {
    value_items(entries)
        .into_iter()
        .filter_map(|entry| {
            let mut parts = value_items(entry).into_iter();
            let id = value_string(&parts.next()?)?;
            let fields = match parts.next() {
                None | Some(Value::Nil) => None,
                Some(v) => Some(
                    value_pairs(v)
                        .into_iter()
                        .filter_map(|(k, v)| Some((value_string(&k)?, value_string(&v)?)))
                        .collect(),
                ),
            };
            Some(Entry { id, fields })
        })
        .collect()
}

pub(super) fn value_items(v: Value) -> Vec<Value> {
    match v {
        Value::Array(items) | Value::Set(items) => items,
        _ => Vec::new(),
    }
}

/// A map, or a flat `[k, v, k, v, …]` array, as pairs.
pub(super) fn value_pairs(v: Value) -> Vec<(Value, Value)> {
    match v {
        Value::Map(pairs) => pairs,
        Value::Array(items) => {
            let mut it = items.into_iter();
            let mut pairs = Vec::new();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                pairs.push((k, v));
            }
            pairs
        }
        _ => Vec::new(),
    }
}

pub(super) fn value_string(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::Int(i) => Some(i.to_string()),
        Value::Okay => Some("OK".to_string()),
        _ => None,
    }
}

pub(super) fn value_u64(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        other => value_string(other)?.parse().ok(),
    }
}
