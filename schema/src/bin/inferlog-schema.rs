//! `inferlog-schema`: the event contract on the command line. `check` is
//! the CI step of every producer team; `normalize` shows what inferlog
//! would store; `json-schema` and `compat` publish and guard the contract;
//! `generate` makes realistic traffic for demos, tests and benchmarks.
//!
//! Exit codes: 0 success, 1 the input has problems (invalid events,
//! breaking changes), 2 usage, config or I/O errors.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand, ValueEnum};
use inferlog_schema::config::{load_config_value, section};
use inferlog_schema::contract::{compat, json_schema};
use inferlog_schema::generate::{Generator, GeneratorConfig};
use inferlog_schema::timestamp::parse_rfc3339_ms;
use inferlog_schema::{Contract, ContractConfig, Rejection, UserIdHasher};
use serde_json::json;

#[derive(Debug, Parser)]
#[command(name = "inferlog-schema", version, about = "The inferlog event contract: check, normalize, publish and generate events")]
struct Cli {
    /// inferlog config file; only its [schema] table is read. INFERLOG_SCHEMA__<KEY> variables override it.
    #[arg(long, global = true, env = "INFERLOG_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate JSONL events: one finding per bad line, then a summary. Exit 1 when any is invalid.
    Check {
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Apply the ingest-time bounds (future skew, hot-tier age) as of this RFC 3339 instant.
        #[arg(long, value_name = "T")]
        now: Option<String>,
        /// JSONL files; `-` reads standard input.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// Print each event as inferlog would store it (needs the hash key from the environment).
    Normalize {
        #[arg(long, value_name = "T")]
        now: Option<String>,
        /// A JSONL file; `-` reads standard input.
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Print the JSON Schema of the input contract.
    JsonSchema,
    /// Fail (exit 1) when the current contract breaks producers written against OLD.json.
    Compat {
        #[arg(value_name = "OLD.json")]
        old: PathBuf,
    },
    /// Realistic synthetic events as JSONL on standard output.
    Generate {
        #[arg(long)]
        count: u64,
        /// Spread events over this many days ending at --end.
        #[arg(long, default_value_t = 1)]
        days: u32,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Share of events (0..1) broken so that they are rejected, over every reason code.
        #[arg(long, default_value_t = 0.0)]
        invalid_ratio: f64,
        /// End of the time window (RFC 3339); default: now, to the minute. Fix it for byte-identical output.
        #[arg(long, value_name = "T")]
        end: Option<String>,
    },
}

/// A failure that ends the command with exit code 2.
struct Fatal(String);

impl<E: std::fmt::Display> From<E> for Fatal {
    fn from(e: E) -> Fatal {
        Fatal(e.to_string())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = run(cli);
    let mut stderr = io::stderr().lock();
    match result {
        Ok(code) => ExitCode::from(code),
        Err(Fatal(message)) => {
            let _ = writeln!(stderr, "inferlog-schema: error: {message}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<u8, Fatal> {
    let root = load_config_value(cli.config.as_deref(), std::env::vars())?;
    let config: ContractConfig = section(&root, "schema")?;
    let contract = Contract::new(&config)?;
    let stdout = io::stdout().lock();
    let mut out = BufWriter::with_capacity(1 << 16, stdout);
    let code = match cli.command {
        Command::Check { format, now, files } => check(&contract, format, parse_now(now.as_deref())?, &files, &mut out),
        Command::Normalize { now, file } => {
            let hasher = UserIdHasher::from_env(config.hash_key_id.as_deref())?;
            normalize(&contract, &hasher, parse_now(now.as_deref())?, &file, &mut out)
        }
        Command::JsonSchema => {
            serde_json::to_writer_pretty(&mut out, &json_schema())?;
            writeln!(out)?;
            Ok(0)
        }
        Command::Compat { old } => compat_command(&old, &mut out),
        Command::Generate { count, days, seed, invalid_ratio, end } => {
            if !(0.0..=1.0).contains(&invalid_ratio) {
                return Err(Fatal(format!("--invalid-ratio {invalid_ratio} must be between 0 and 1")));
            }
            let end_ms = match end {
                Some(t) => parse_time(&t, "--end")?,
                None => now_ms() / 60_000 * 60_000,
            };
            let generator = Generator::new(GeneratorConfig { seed, days, end_ms, invalid_ratio });
            for event in generator.take(count as usize) {
                out.write_all(&event.line)?;
                out.write_all(b"\n")?;
            }
            Ok(0)
        }
    };
    let code = code.and_then(|c| out.flush().map(|()| c).map_err(Fatal::from));
    match code {
        // A closed pipe (`| head`) is the reader's choice, not a failure.
        Err(Fatal(m)) if m.contains("Broken pipe") => Ok(0),
        other => other,
    }
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn parse_time(value: &str, flag: &str) -> Result<i64, Fatal> {
    parse_rfc3339_ms(value).map_err(|e| Fatal(format!("{flag} {value:?} is not an RFC 3339 time with an offset: {e:?}")))
}

fn parse_now(value: Option<&str>) -> Result<Option<i64>, Fatal> {
    value.map(|v| parse_time(v, "--now")).transpose()
}

fn open(path: &PathBuf) -> Result<Box<dyn BufRead>, Fatal> {
    if path.as_os_str() == "-" {
        return Ok(Box::new(BufReader::new(io::stdin())));
    }
    let file = File::open(path).map_err(|e| Fatal(format!("cannot open {}: {e}", path.display())))?;
    Ok(Box::new(BufReader::with_capacity(1 << 16, file)))
}

/// Calls `each(line_number, bytes)` for every non-blank line, without the
/// line ending. Lines are bytes: invalid UTF-8 is the parser's to report.
fn for_each_line(path: &PathBuf, mut each: impl FnMut(u64, &[u8]) -> Result<(), Fatal>) -> Result<(), Fatal> {
    let mut reader = open(path)?;
    let mut buf = Vec::with_capacity(4096);
    let mut number = 0u64;
    loop {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf).map_err(|e| Fatal(format!("cannot read {}: {e}", path.display())))?;
        if n == 0 {
            return Ok(());
        }
        number += 1;
        let line = buf.strip_suffix(b"\n").unwrap_or(&buf);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        each(number, line)?;
    }
}

#[derive(Debug, Default)]
struct Tally {
    checked: u64,
    invalid: u64,
    by_reason: BTreeMap<&'static str, u64>,
    dropped: BTreeMap<String, u64>,
}

impl Tally {
    fn record(&mut self, outcome: Result<Vec<String>, &Rejection>) {
        self.checked += 1;
        match outcome {
            Ok(dropped) => {
                for name in dropped {
                    *self.dropped.entry(name).or_default() += 1;
                }
            }
            Err(rejection) => {
                self.invalid += 1;
                *self.by_reason.entry(rejection.reason.as_str()).or_default() += 1;
            }
        }
    }

    fn summary_line(&self) -> String {
        format!("checked {} events: {} valid, {} invalid", self.checked, self.checked - self.invalid, self.invalid)
    }

    fn exit_code(&self) -> u8 {
        u8::from(self.invalid > 0)
    }
}

fn finding_text(file: &str, line: u64, r: &Rejection) -> String {
    format!("{file}:{line}: {}: {}: {}", r.reason, r.field, r.message)
}

fn check(contract: &Contract, format: Format, now: Option<i64>, files: &[PathBuf], out: &mut impl Write) -> Result<u8, Fatal> {
    let mut tally = Tally::default();
    for path in files {
        let file = path.display().to_string();
        for_each_line(path, |line, bytes| {
            let outcome = contract.check(bytes, now);
            if let Err(r) = &outcome {
                match format {
                    Format::Text => writeln!(out, "{}", finding_text(&file, line, r))?,
                    Format::Json => writeln!(
                        out,
                        "{}",
                        json!({"type": "finding", "file": file, "line": line, "reason": r.reason.as_str(), "field": r.field, "message": r.message})
                    )?,
                }
            }
            match outcome {
                Ok(dropped) => tally.record(Ok(dropped)),
                Err(r) => tally.record(Err(&r)),
            }
            Ok(())
        })?;
    }
    match format {
        Format::Text => writeln!(out, "{}", tally.summary_line())?,
        Format::Json => writeln!(
            out,
            "{}",
            json!({
                "type": "summary",
                "checked": tally.checked,
                "valid": tally.checked - tally.invalid,
                "invalid": tally.invalid,
                "by_reason": tally.by_reason,
                "dropped_fields": tally.dropped,
            })
        )?,
    }
    Ok(tally.exit_code())
}

fn normalize(contract: &Contract, hasher: &UserIdHasher, now: Option<i64>, path: &PathBuf, out: &mut impl Write) -> Result<u8, Fatal> {
    let mut tally = Tally::default();
    let file = path.display().to_string();
    let mut stderr = io::stderr().lock();
    for_each_line(path, |line, bytes| {
        match contract.normalize(bytes, now, hasher) {
            Ok(normalized) => {
                serde_json::to_writer(&mut *out, &normalized.event)?;
                out.write_all(b"\n")?;
                tally.record(Ok(normalized.dropped_fields));
            }
            Err(r) => {
                writeln!(stderr, "{}", finding_text(&file, line, &r))?;
                tally.record(Err(&r));
            }
        }
        Ok(())
    })?;
    writeln!(stderr, "{}", tally.summary_line())?;
    if !tally.dropped.is_empty() {
        let dropped: Vec<String> = tally.dropped.iter().map(|(k, v)| format!("{k} ({v})")).collect();
        writeln!(stderr, "dropped fields: {}", dropped.join(", "))?;
    }
    Ok(tally.exit_code())
}

fn compat_command(old_path: &PathBuf, out: &mut impl Write) -> Result<u8, Fatal> {
    let mut text = String::new();
    File::open(old_path).and_then(|mut f| f.read_to_string(&mut text)).map_err(|e| Fatal(format!("cannot read {}: {e}", old_path.display())))?;
    let old: serde_json::Value = serde_json::from_str(&text).map_err(|e| Fatal(format!("{} is not JSON: {e}", old_path.display())))?;
    if !old["properties"].is_object() {
        return Err(Fatal(format!("{} is not an inferlog JSON Schema (no \"properties\")", old_path.display())));
    }
    let breaks = compat(&old, &json_schema());
    for b in &breaks {
        writeln!(out, "{}: breaking: {}: {}", old_path.display(), b.field, b.what)?;
    }
    if breaks.is_empty() {
        writeln!(out, "compatible: producers written against {} keep working", old_path.display())?;
    } else {
        writeln!(out, "{} breaking change(s) against {}", breaks.len(), old_path.display())?;
    }
    Ok(u8::from(!breaks.is_empty()))
}
