//! `inferlog-seed-hot --table T --count N --days D --end-day YYYY-MM-DD [--seed S]`:
//! fills a ClickHouse hot table with generated rows of any age, bypassing
//! Kafka (for the compactor and retention benchmarks and demos of old days).

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let get = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let (Some(table), Some(count), Some(end_day)) = (get("--table"), get("--count"), get("--end-day")) else {
        tracing_free_usage();
        return ExitCode::from(2);
    };
    let database = get("--database").unwrap_or_else(|| "inferlog".into());
    let url = get("--url").unwrap_or_else(inferlog_tests::clickhouse_url);
    let days: u32 = get("--days").and_then(|d| d.parse().ok()).unwrap_or(1);
    let seed: u64 = get("--seed").and_then(|s| s.parse().ok()).unwrap_or(42);
    let (Ok(count), Some(end)) = (count.parse::<usize>(), inferlog_schema::timestamp::parse_day(&end_day)) else {
        tracing_free_usage();
        return ExitCode::from(2);
    };
    // --end-day is the last day with rows.
    let end_ms = end + inferlog_schema::timestamp::MS_PER_DAY;
    let events = inferlog_tests::seed::seeded_events(count, days, end_ms, seed);
    inferlog_tests::seed::insert_hot(&url, &database, &table, &events);
    // The same events as JSON lines, as `inferlog-schema normalize` prints them: the baseline of the Parquet size ratio.
    let json_bytes: usize = events.iter().map(|e| e.to_json().len() + 1).sum();
    report(&format!("rows={} json_bytes={json_bytes}", events.len()));
    ExitCode::SUCCESS
}

#[allow(clippy::print_stdout)]
fn report(line: &str) {
    println!("{line}");
}

#[allow(clippy::print_stderr)]
fn tracing_free_usage() {
    eprintln!("usage: inferlog-seed-hot --table T --count N --end-day YYYY-MM-DD [--days D] [--seed S] [--database DB] [--url URL]");
}
