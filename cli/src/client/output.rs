//! What a command prints: one JSON document on stdout with `--json`, for
//! agents and scripts; otherwise lines and tables for people.

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;

/// Prints `value` as the command's one JSON document.
pub fn json(value: &Value) {
    println!("{}", serde_json::to_string_pretty(value).expect("JSON values serialise"));
}

/// A plain table: a header row and left-aligned columns two spaces apart.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        padded.join("  ").trim_end().to_owned()
    };
    let mut out = vec![line(header.to_vec())];
    out.extend(rows.iter().map(|row| line(row.iter().map(String::as_str).collect())));
    out.join("\n")
}

/// An atomic amount in human units: `1500000` with 6 decimals is `1.5`.
pub fn human_amount(atomic: &str, decimals: u32) -> String {
    if !atomic.bytes().all(|b| b.is_ascii_digit()) || atomic.is_empty() {
        return atomic.to_owned();
    }
    let decimals = decimals as usize;
    let padded = format!("{atomic:0>width$}", width = decimals + 1);
    let (whole, fraction) = padded.split_at(padded.len() - decimals);
    let fraction = fraction.trim_end_matches('0');
    if fraction.is_empty() { whole.to_owned() } else { format!("{whole}.{fraction}") }
}

/// A byte-counting bar for an upload or a download; hidden when `quiet`
/// (`--json`).
pub fn bar(len: u64, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_read_in_human_units() {
        for (atomic, decimals, human) in [
            ("1500000", 6, "1.5"),
            ("1", 6, "0.000001"),
            ("0", 6, "0"),
            ("2000000", 6, "2"),
            ("42", 0, "42"),
            ("x", 6, "x"),
        ] {
            assert_eq!(human_amount(atomic, decimals), human, "{atomic} / 10^{decimals}");
        }
    }

    #[test]
    fn tables_align_their_columns() {
        let t = table(&["KIND", "PRICE"], &[vec!["digest".into(), "free".into()], vec!["x".into(), "0.01".into()]]);
        assert_eq!(t, "KIND    PRICE\ndigest  free\nx       0.01");
    }
}
