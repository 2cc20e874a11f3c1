//! A word-frequency counter that speaks Reeve's executor protocol
//! (docs/executors.md), asynchronously: it downloads its text input,
//! counts words line by line as the bytes arrive, reports progress (and,
//! for a metered kind, usage in lines) as it reads, uploads the 100 most
//! frequent words as a CSV output, and ends with a summary result.

use std::collections::HashMap;

use futures_util::StreamExt;
use reeve_executor::{Failure, Job, Reporter, WorkError};
use serde_json::{Value, json};

/// The output's name, as the buyer sees it.
pub const OUTPUT: &str = "top-100.csv";
/// How many words the CSV holds, and how many the result shows.
const CSV_WORDS: usize = 100;
const RESULT_WORDS: usize = 10;

/// How often to report, in lines read.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub report_every: u64,
}

impl Settings {
    /// `WORDFREQ_REPORT_EVERY` lines (10,000 by default).
    pub fn from_env() -> Self {
        let report_every = std::env::var("WORDFREQ_REPORT_EVERY").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
        Settings { report_every: u64::max(report_every, 1) }
    }
}

/// Words counted so far. A word is a run of letters and digits (apostrophes
/// inside a word kept), lowercased.
#[derive(Debug, Default)]
pub struct Counter {
    pub lines: u64,
    pub words: u64,
    counts: HashMap<String, u64>,
}

impl Counter {
    pub fn add_line(&mut self, line: &str) {
        self.lines += 1;
        let is_word_char = |c: char| c.is_alphanumeric() || c == '\'';
        for word in line.split(|c: char| !is_word_char(c)) {
            let word = word.trim_matches('\'');
            if word.is_empty() {
                continue;
            }
            self.words += 1;
            *self.counts.entry(word.to_lowercase()).or_default() += 1;
        }
    }

    pub fn distinct(&self) -> usize {
        self.counts.len()
    }

    /// The `n` most frequent words, the most frequent first, ties in
    /// alphabetical order (so the same text always gives the same list).
    pub fn top(&self, n: usize) -> Vec<(&str, u64)> {
        let mut all: Vec<(&str, u64)> = self.counts.iter().map(|(w, c)| (w.as_str(), *c)).collect();
        all.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        all.truncate(n);
        all
    }

    /// `word,count` lines for the `n` most frequent words, with a header.
    pub fn csv(&self, n: usize) -> String {
        let mut csv = String::from("word,count\n");
        for (word, count) in self.top(n) {
            // A word is letters, digits and apostrophes: nothing to quote.
            csv.push_str(&format!("{word},{count}\n"));
        }
        csv
    }
}

/// Works on one job: the whole asynchronous attempt, ended with a result
/// report. An error is reported by the caller ([`Reporter::finish`]).
pub async fn work(job: Job, reporter: Reporter, settings: Settings) -> Result<(), WorkError> {
    let Some(file) = job.files.first() else {
        return Err(Failure::permanent("the input names no text file (upload_id)").into());
    };
    let metered = job.metered.is_some();
    let response =
        reqwest::get(&file.url).await.map_err(|_| Failure::retryable("the input could not be read", None))?;
    let status = response.status();
    if status.is_client_error() {
        return Err(Failure::permanent("the input file could not be read").into());
    }
    if !status.is_success() {
        return Err(Failure::retryable(format!("the input file could not be read ({status})"), None).into());
    }
    let size = file.size.max(1);
    reporter.progress(0.0, Some("reading")).await?;

    let mut counter = Counter::default();
    let mut pending: Vec<u8> = Vec::new();
    let mut read: u64 = 0;
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|_| Failure::retryable("the input's download broke off", None))?;
        read += chunk.len() as u64;
        pending.extend_from_slice(&chunk);
        let mut start = 0;
        while let Some(end) = pending[start..].iter().position(|b| *b == b'\n') {
            let line = &pending[start..start + end];
            counter.add_line(&String::from_utf8_lossy(line));
            start += end + 1;
            // A cancel that reached this process (an HTTP service's
            // `Cancels`) stops the count here; otherwise the next report's
            // `409 canceled` does.
            reporter.check().await?;
            if counter.lines % settings.report_every == 0 {
                let fraction = read as f64 / size as f64;
                reporter.progress(fraction.min(0.99), Some(&format!("{} lines read", counter.lines))).await?;
                if metered {
                    reporter.usage(counter.lines).await?;
                }
            }
        }
        pending.drain(..start);
    }
    if !pending.is_empty() {
        counter.add_line(&String::from_utf8_lossy(&pending));
    }

    reporter.progress(1.0, Some(&format!("{} lines read; writing {OUTPUT}", counter.lines))).await?;
    if metered {
        reporter.usage(counter.lines).await?;
    }
    reporter.output(OUTPUT, "text/csv", counter.csv(CSV_WORDS)).await?;
    reporter.result(summary(&counter), metered.then_some(counter.lines)).await?;
    Ok(())
}

/// The task's result: counts, the ten most frequent words, the output's name.
pub fn summary(counter: &Counter) -> Value {
    let top: Vec<Value> = counter.top(RESULT_WORDS).iter().map(|(w, c)| json!({"word": w, "count": c})).collect();
    json!({
        "lines": counter.lines,
        "words": counter.words,
        "distinct": counter.distinct(),
        "top": top,
        "output": OUTPUT,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_counted_lowercased_and_ranked() {
        let mut c = Counter::default();
        for line in ["The cat and the hat.", "", "It's the cat's hat, 'quoted' — THE end", "über Über 42"] {
            c.add_line(line);
        }
        assert_eq!(c.lines, 4);
        assert_eq!(c.words, 5 + 7 + 3);
        // Ties in alphabetical order; apostrophes inside a word kept.
        assert_eq!(c.top(3), vec![("the", 4), ("hat", 2), ("über", 2)]);
        assert_eq!(c.top(100).len(), c.distinct());
        assert!(c.top(100).contains(&("cat's", 1)) && c.top(100).contains(&("quoted", 1)));
        assert_eq!(c.csv(2), "word,count\nthe,4\nhat,2\n");
    }
}
