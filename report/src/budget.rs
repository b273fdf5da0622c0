//! The `budget` view. In: every business line's [`BudgetStatus`] as of a
//! day. Out: a table (text) or a document (JSON) of spend, budget, used
//! share and month-end forecast, and whether any line is over 90% of its
//! budget (the command then exits 1).

use inferlog_store::budget::{Basis, BudgetStatus, Unit, ALERT_RATIO};
use serde::Serialize;

/// The view's JSON document.
#[derive(Debug, Clone, Serialize)]
pub struct BudgetReport {
    /// The day the report is as of (`YYYY-MM-DD`); the days before it are closed.
    pub as_of: String,
    pub alert_ratio: f64,
    pub lines: Vec<BudgetStatus>,
    /// Business lines at or over [`ALERT_RATIO`] of their budget.
    pub over: Vec<String>,
}

impl BudgetReport {
    pub fn new(as_of: String, lines: Vec<BudgetStatus>) -> BudgetReport {
        let over = lines.iter().filter(|s| s.over_alert()).map(|s| s.business_line.clone()).collect();
        BudgetReport { as_of, alert_ratio: ALERT_RATIO, lines, over }
    }

    pub fn exit_code(&self) -> i32 {
        i32::from(!self.over.is_empty())
    }

    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }

    pub fn text(&self) -> String {
        let amount = |unit: Unit, v: f64| match unit {
            Unit::Usd => format!("${v:.2}"),
            Unit::Tokens => format!("{v:.0} tok"),
        };
        let share = |r: Option<f64>| r.map_or_else(|| "-".to_owned(), |r| format!("{:.1}%", r * 100.0));
        let Some(first) = self.lines.first() else {
            return format!("no aggregates and no budgets for the month before {}\n", self.as_of);
        };
        let mut out = format!("budgets for {} ({} of {} days closed, as of {})\n", first.month, first.days_elapsed, first.days_in_month, self.as_of);
        if first.days_covered < first.days_elapsed {
            out.push_str(&format!(
                "spend covers the {} of them the aggregates hold (the compactor is behind); the forecast runs at their rate\n",
                first.days_covered
            ));
        }
        out.push_str(&format!(
            "{:<20} {:>16} {:>16} {:>7} {:>16} {:>9} {:<10} {:>9}\n",
            "business line", "spent", "budget", "used", "forecast", "forecast%", "basis", "unpriced"
        ));
        for s in &self.lines {
            let basis = match s.basis {
                Basis::Configured => "configured",
                Basis::Default => "default",
                Basis::None => "none",
            };
            out.push_str(&format!(
                "{:<20} {:>16} {:>16} {:>7} {:>16} {:>9} {:<10} {:>9}{}\n",
                s.business_line,
                amount(s.unit, s.spent),
                s.budget.map_or_else(|| "-".to_owned(), |b| amount(s.unit, b)),
                share(s.used_ratio),
                amount(s.unit, s.forecast),
                share(s.forecast_ratio),
                basis,
                s.unpriced_requests,
                if s.over_alert() { "  OVER 90%" } else { "" },
            ));
        }
        if !self.over.is_empty() {
            out.push_str(&format!("at or over {:.0}% of the budget: {}\n", ALERT_RATIO * 100.0, self.over.join(", ")));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(line: &str, used: Option<f64>) -> BudgetStatus {
        BudgetStatus {
            business_line: line.into(),
            month: "2026-11".into(),
            unit: Unit::Usd,
            basis: if used.is_some() { Basis::Configured } else { Basis::None },
            spent: 95.0,
            budget: used.map(|u| 95.0 / u),
            used_ratio: used,
            forecast: 190.0,
            forecast_ratio: used.map(|u| 2.0 * u),
            days_elapsed: 15,
            days_in_month: 30,
            days_covered: 15,
            unpriced_requests: 3,
        }
    }

    #[test]
    fn a_line_over_90_percent_makes_the_command_fail() {
        let fine = BudgetReport::new("2026-11-16".into(), vec![status("search", Some(0.89)), status("new", None)]);
        assert_eq!(fine.exit_code(), 0, "89% and no budget at all are fine");
        let over = BudgetReport::new("2026-11-16".into(), vec![status("search", Some(0.89)), status("chat", Some(0.95)), status("ads", Some(0.9))]);
        assert_eq!(over.exit_code(), 1);
        assert_eq!(over.over, ["chat", "ads"], "90% and more");
        let text = over.text();
        assert!(text.starts_with("budgets for 2026-11 (15 of 30 days closed, as of 2026-11-16)"), "{text}");
        assert!(text.lines().any(|l| l.starts_with("chat") && l.contains("95.0%") && l.ends_with("OVER 90%")), "{text}");
        assert!(text.contains("at or over 90% of the budget: chat, ads"), "{text}");
        let json: serde_json::Value = serde_json::from_str(&over.json()).expect("json");
        assert_eq!(json["lines"][1]["used_ratio"], 0.95);
        assert_eq!(json["lines"][0]["basis"], "configured");
        assert_eq!(json["over"][0], "chat");
    }
}
