//! The settings tree's tests, by concern: loading the file and the environment
//! (`load`), the registry and `agentq.example.toml` (`registry`), `[mcp]` (`mcp`), the rules and their
//! messages (`validation`), and the sections with tables of their own (`sections`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use super::*;

mod load;
mod mcp;
mod registry;
mod sections;
mod validation;

pub(super) fn no_env(_: &str) -> Option<String> {
    None
}

pub(super) fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

pub(super) fn invalid_with(tweak: impl FnOnce(&mut Settings)) -> String {
    let mut s = Settings::default();
    tweak(&mut s);
    s.validate().unwrap_err().to_string()
}

pub(super) fn budget(tokens: Option<u64>, usd: Option<f64>) -> BudgetSettings {
    BudgetSettings {
        tenant: "acme".into(),
        period: crate::budget::Period::Day,
        tokens,
        usd,
        on_budget: crate::budget::OnBudget::Park,
    }
}
