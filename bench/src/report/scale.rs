//! How the scale part's figures ([`ScaleFigures`], measured by [`crate::scale`]) are shown:
//! rows of the table and fields of the JSON object.

use serde_json::{Value, json};

use super::{Results, Rows};

/// What the scale part measured.
#[derive(Debug, Default, Clone)]
pub struct ScaleFigures {
    /// One tenant's holds (each then settled) per second, and a hold's p50/p99 in ms.
    pub budget_holds_per_s: f64,
    pub budget_hold_p50_ms: f64,
    pub budget_hold_p99_ms: f64,
    /// WAL bytes Postgres writes per lease renewed.
    pub heartbeat_wal_bytes_per_lease: f64,
    /// The limiter's calls/s and a reservation's p50 in ms, on this Redis, on a cluster of
    /// one node and on a 3-master cluster.
    pub limiter_standalone: (f64, f64),
    pub limiter_one_node: (f64, f64),
    pub limiter_cluster: (f64, f64),
    /// The throughput workload's iterations/s on each layout, each round's.
    pub routing: Vec<RoutingFigure>,
}

/// One layout of the routing figures (Postgres shards, Redis or cluster).
#[derive(Debug, Clone)]
pub struct RoutingFigure {
    pub layout: &'static str,
    pub iterations_per_s: Vec<f64>,
}

impl RoutingFigure {
    pub fn mean(&self) -> f64 {
        self.iterations_per_s.iter().sum::<f64>() / self.iterations_per_s.len().max(1) as f64
    }

    /// This layout's iterations/s over `base`'s, round by round (each round ran every
    /// layout one after another), sorted.
    pub fn ratios(&self, base: &RoutingFigure) -> Vec<f64> {
        let mut out: Vec<f64> = self
            .iterations_per_s
            .iter()
            .zip(&base.iterations_per_s)
            .filter(|(_, b)| **b > 0.0)
            .map(|(x, b)| x / b)
            .collect();
        out.sort_by(f64::total_cmp);
        out
    }
}

pub fn rows(r: &Results, rows: &mut Rows) {
    let Some(s) = &r.scale else { return };
    rows.add(
        "scale",
        "one tenant's budget holds/s (64 at once), hold p50 / p99".into(),
        format!(
            "{:.0}, {:.2} / {:.2} ms",
            s.budget_holds_per_s, s.budget_hold_p50_ms, s.budget_hold_p99_ms
        ),
        String::new(),
    );
    rows.add(
        "",
        "WAL per lease renewed".into(),
        format!("{:.0} B", s.heartbeat_wal_bytes_per_lease),
        String::new(),
    );
    for (name, (per_s, p50)) in [
        ("one Redis", s.limiter_standalone),
        ("cluster of 1 node", s.limiter_one_node),
        ("3-master cluster", s.limiter_cluster),
    ] {
        rows.add(
            "",
            format!("limiter calls/s (64 at once), reservation p50, {name}"),
            format!("{per_s:.0}, {:.0} µs", p50 * 1000.0),
            String::new(),
        );
    }
    // Each layout against the first (one Postgres, one Redis) round by round: the median
    // of the rounds' ratios and their spread.
    let base = s.routing.first();
    for (i, figure) in s.routing.iter().enumerate() {
        let rounds: Vec<String> = figure
            .iterations_per_s
            .iter()
            .map(|x| format!("{x:.0}"))
            .collect();
        let ratios = base.map(|b| figure.ratios(b)).unwrap_or_default();
        let ratio = match (ratios.first(), ratios.last()) {
            (Some(lo), Some(hi)) if i > 0 => {
                format!(" (× {:.3}, {lo:.3}–{hi:.3})", ratios[ratios.len() / 2])
            }
            _ => String::new(),
        };
        rows.add(
            "",
            format!("iterations/s, {}", figure.layout),
            format!("{:.0}{ratio}; rounds {}", figure.mean(), rounds.join(", ")),
            String::new(),
        );
    }
}

/// The figures as JSON fields (null when the part did not run).
pub fn to_json(r: &Results) -> Vec<(&'static str, Value)> {
    let s = r.scale.as_ref();
    vec![
        (
            "scale_budget_holds_per_s",
            json!(s.map(|s| s.budget_holds_per_s)),
        ),
        (
            "scale_budget_hold_p50_ms",
            json!(s.map(|s| s.budget_hold_p50_ms)),
        ),
        (
            "scale_budget_hold_p99_ms",
            json!(s.map(|s| s.budget_hold_p99_ms)),
        ),
        (
            "scale_heartbeat_wal_bytes_per_lease",
            json!(s.map(|s| s.heartbeat_wal_bytes_per_lease)),
        ),
        (
            "scale_limiter_calls_per_s",
            json!(s.map(|s| s.limiter_standalone.0)),
        ),
        (
            "scale_limiter_p50_ms",
            json!(s.map(|s| s.limiter_standalone.1)),
        ),
        (
            "scale_limiter_one_node_calls_per_s",
            json!(s.map(|s| s.limiter_one_node.0)),
        ),
        (
            "scale_limiter_one_node_p50_ms",
            json!(s.map(|s| s.limiter_one_node.1)),
        ),
        (
            "scale_limiter_cluster_calls_per_s",
            json!(s.map(|s| s.limiter_cluster.0)),
        ),
        (
            "scale_limiter_cluster_p50_ms",
            json!(s.map(|s| s.limiter_cluster.1)),
        ),
        (
            "scale_routing_iterations_per_s",
            json!(s.map(|s| {
                s.routing
                    .iter()
                    .map(|f| (f.layout.to_string(), json!(f.iterations_per_s)))
                    .collect::<serde_json::Map<_, _>>()
            })),
        ),
    ]
}
