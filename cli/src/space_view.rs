//! `reeve space`: the Space's payments, credits and free-task quotas
//! (`GET /v1/space`).
//!
//! `reeve space` fetches the document and prints [`render`]; `--json`
//! prints it as is.

use serde_json::Value;

/// The three tables, for people.
pub fn render(space: &Value) -> String {
    let list = |k: &str| space[k].as_array().cloned().unwrap_or_default();
    let s = |v: &Value, k: &str| match &v[k] {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut out = String::from("PAYMENTS\n");
    let payments = list("payments");
    if payments.is_empty() {
        out.push_str("  none\n");
    }
    let mut rows = vec![["TASK", "NETWORK", "AMOUNT", "TRANSACTION"].map(String::from).to_vec()];
    rows.extend(payments.iter().map(|p| vec![s(p, "task_id"), s(p, "network"), s(p, "amount"), s(p, "transaction")]));
    if !payments.is_empty() {
        out.push_str(&table(&rows));
    }
    out.push_str("CREDITS\n");
    let credits = list("credits");
    if credits.is_empty() {
        out.push_str("  none\n");
    } else {
        let mut rows = vec![["NETWORK", "AMOUNT", "REASON", "FROM TASK", "SPENT BY"].map(String::from).to_vec()];
        rows.extend(
            credits
                .iter()
                .map(|c| vec![s(c, "network"), s(c, "amount"), s(c, "reason"), s(c, "source_task"), s(c, "spent_by")]),
        );
        out.push_str(&table(&rows));
    }
    // Free kinds only: a priced kind's limit is its payment.
    out.push_str("FREE TASK QUOTAS\n");
    let quotas = list("quotas");
    if quotas.is_empty() {
        out.push_str("  none\n");
        return out;
    }
    let used = |q: &Value, k: &str| format!("{} of {}", s(&q[k], "used"), s(&q[k], "limit"));
    let mut rows = vec![["KIND", "LAST HOUR", "QUEUED OR RUNNING"].map(String::from).to_vec()];
    rows.extend(quotas.iter().map(|q| vec![s(q, "kind"), used(q, "per_hour"), used(q, "at_once")]));
    out.push_str(&table(&rows));
    out
}

fn table(rows: &[Vec<String>]) -> String {
    let n = rows[0].len();
    let widths: Vec<usize> = (0..n).map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str("  ");
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn payments_and_credits_render_as_tables() {
        let text = render(&json!({
            "payments": [{"task_id": "01A", "network": "eip155:84532", "amount": "10000", "transaction": "0xabc"}],
            "credits": [{"network": "eip155:84532", "amount": "10000", "reason": "retries_exhausted",
                         "source_task": "01A", "spent_by": null}]
        }));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "PAYMENTS");
        assert!(lines[2].contains("01A") && lines[2].contains("0xabc"));
        assert_eq!(lines[3], "CREDITS");
        assert!(lines[5].contains("retries_exhausted") && lines[5].ends_with('-'), "{text}");
        assert_eq!(
            render(&json!({"payments": [], "credits": [], "quotas": []})),
            "PAYMENTS\n  none\nCREDITS\n  none\nFREE TASK QUOTAS\n  none\n"
        );
    }

    #[test]
    fn quotas_show_use_of_limit() {
        let text = render(&json!({
            "payments": [], "credits": [],
            "quotas": [{"kind": "digest", "per_hour": {"limit": 100, "used": 3}, "at_once": {"limit": 10, "used": 1}}]
        }));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[4], "FREE TASK QUOTAS");
        assert_eq!(lines[5], "  KIND    LAST HOUR  QUEUED OR RUNNING");
        assert_eq!(lines[6], "  digest  3 of 100   1 of 10");
    }
}
