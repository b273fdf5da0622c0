//! The whole pipeline in one scenario, for the end-to-end tests: a topic and
//! DLQ, a hot table and rejects table, a Postgres schema and a cold prefix,
//! one config for ingest, the compactor and retention; and the
//! reconciliation the contract promises, checked against the generated input:
//! every produced event in exactly one place (hot, cold for released days,
//! or the DLQ with its reason), no plaintext user id or PII in any tier,
//! aggregates equal to figures computed here, and a clean audit.

use std::collections::{BTreeMap, HashSet};
use std::process::{Child, Command, Output};

use inferlog_schema::generate::GeneratedEvent;
use inferlog_schema::timestamp::MS_PER_DAY;
use inferlog_schema::{Contract, ContractConfig, InferenceEvent, ReasonCode, UserIdHasher};

use crate::tiers::{day_string, today, TierScenario};
use crate::{expected_reasons, kafkatool, read_topic, unique};

const HASH_KEY: &str = "e2e-test-key-0123456789abcdef";

/// A plaintext user id as the generator writes them (`u-` and six digits),
/// an e-mail address or a phone number: none may reach a tier. Escaped for
/// a ClickHouse string literal.
const PLAINTEXT: &str = "u-[0-9]{6}|[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\\\\.[a-z]{2,}|\\\\+[0-9][0-9 ]{7,}";

/// Three days of hot retention, and ingest accepts nothing older: events
/// over the last two days land in three UTC days; the compactor closes the
/// older two, and retention at [`Pipeline::later`] releases them.
#[derive(Debug)]
pub struct Pipeline {
    pub tiers: TierScenario,
    pub topic: String,
    pub dlq: String,
    pub rejects_table: String,
    /// The ClickHouse server the checks read (the single server, or a node of the cluster).
    pub clickhouse: String,
    env: Vec<(String, String)>,
}

impl Pipeline {
    pub fn new(name: &str, partitions: u32) -> Pipeline {
        let id = unique(name);
        let (topic, dlq) = (format!("{id}-events"), format!("{id}-dlq"));
        let tiers = TierScenario::new(
            name,
            &format!(
                "[schema]\nmax_event_age = \"3d\"\n\n[retention]\nhot_days = 3\nmetrics_addr = \"\"\n\n\
                 [kafka]\nbrokers = \"{}\"\ntopics = [\"{topic}\"]\ngroup_id = \"{id}\"\ndlq_topic = \"{dlq}\"\nassignment = \"static\"\n\n\
                 [ingest]\nmetrics_addr = \"\"\n",
                crate::kafka_brokers()
            ),
        );
        let p = partitions.to_string();
        kafkatool(&["create-topics", "--partitions", &p, &topic]);
        // The DLQ keeps messages no longer than the hot policy (3 days: retention.ms
        // plus segment.ms, the longest a message can live), or the audit objects.
        kafkatool(&["create-topics", "--partitions", &p, "--config", "retention.ms=172800000", "--config", "segment.ms=86400000", &dlq]);
        let key_file = tiers.dir.path().join("hash.key");
        std::fs::write(&key_file, HASH_KEY).expect("hash key");
        let rejects_table = format!("{id}_rejects");
        let env = vec![
            ("INFERLOG_CLICKHOUSE__REJECTS_TABLE".to_owned(), rejects_table.clone()),
            ("INFERLOG_HASH_KEY_FILE".to_owned(), key_file.to_string_lossy().into_owned()),
            ("INFERLOG_COMPACTOR__LATENESS".to_owned(), "1s".to_owned()),
        ];
        Pipeline { tiers, topic, dlq, rejects_table, clickhouse: crate::clickhouse_url(), env }
    }

    /// A query of the checks, on [`Pipeline::clickhouse`].
    pub fn try_query(&self, sql: &str) -> Result<String, String> {
        crate::try_clickhouse_at(&self.clickhouse, sql)
    }

    fn query_u64(&self, sql: &str) -> u64 {
        self.try_query(sql).unwrap_or_else(|e| panic!("{e}")).parse().unwrap_or_else(|e| panic!("{sql}: not a number: {e}"))
    }

    /// Noon three days from now: both closed days are past the hot policy.
    pub fn later() -> String {
        format!("{}T12:00:00Z", day_string(today() + 3))
    }

    /// A command running `binary args` on this pipeline's config, with `extra` environment.
    pub fn command(&self, binary: &str, args: &[&str], log: &str, extra: &[(&str, &str)]) -> Command {
        let mut env: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        env.extend_from_slice(extra);
        self.tiers.command(binary, args, log, &env)
    }

    pub fn spawn(&self, binary: &str, args: &[&str], log: &str, extra: &[(&str, &str)]) -> Child {
        self.command(binary, args, log, extra).spawn().expect("spawn")
    }

    pub fn output(&self, binary: &str, args: &[&str], log: &str) -> Output {
        self.command(binary, args, log, &[]).output().expect("run")
    }

    /// Runs `binary args` to the end and asserts exit 0.
    pub fn run_ok(&self, binary: &str, args: &[&str], log: &str) {
        let out = self.output(binary, args, log);
        assert!(out.status.success(), "{binary} {args:?}: {}\n{}\n{}", out.status, String::from_utf8_lossy(&out.stdout), self.tiers.log(log));
    }

    /// Hot rows + logged rejects: what ingest has made durable so far.
    pub fn ingested(&self) -> u64 {
        let hot = self.try_query(&format!("SELECT count() FROM {}", self.tiers.qualified_table())).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
        let rejects =
            self.try_query(&format!("SELECT count() FROM inferlog_test.{}", self.rejects_table)).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
        hot + rejects
    }

    /// Everything the contract promises once the pipeline has run to the end
    /// (ingest drained, every closed day compacted, retention enforced at
    /// [`Pipeline::later`]); `replayed`: the DLQ replay run before the
    /// compactor, if any.
    pub fn reconcile(&self, events: &[GeneratedEvent], replayed: Option<&Replayed>) {
        let s = &self.tiers;
        let valid = normalized(events);
        let rejected = events.len() - valid.len();
        // The refused events the fixed contract accepts, computed from the
        // input: each must be stored once, like a live event.
        let recovered: Vec<InferenceEvent> = replayed.map_or_else(Vec::new, |r| normalized_by(events, &r.contract, Some(r.reason)));
        let still_invalid = rejected - recovered.len();
        if replayed.is_some() {
            assert!(!recovered.is_empty(), "the input holds events for the replay");
            assert_eq!(
                s.psql("SELECT count(*) FROM dlq_replayed WHERE state = 'stored'"),
                recovered.len().to_string(),
                "the replay ledger holds each recovered event once, stored"
            );
        }

        // Where each stored event should be: by its UTC day.
        let mut by_day: BTreeMap<i32, Vec<&InferenceEvent>> = BTreeMap::new();
        for e in valid.iter().chain(&recovered) {
            by_day.entry(e.timestamp_ms.div_euclid(MS_PER_DAY) as i32).or_default().push(e);
        }
        let released: Vec<i32> = by_day.keys().copied().filter(|d| *d < today()).collect();
        assert!(!released.is_empty() && by_day.contains_key(&today()), "the input spans closed days and today: {:?}", by_day.keys());
        let released_list = released.iter().map(|d| format!("'{}'", day_string(*d))).collect::<Vec<_>>().join(",");
        assert_eq!(
            s.psql(&format!("SELECT count(*) FROM compactor_days WHERE state = 'released' AND day IN ({released_list})")),
            released.len().to_string(),
            "every closed day was released: {}\ncompactor:\n{}",
            s.psql("SELECT day, state, last_error FROM compactor_days ORDER BY day"),
            s.log("compactor.log")
        );

        // Hot: exactly today's events, each once.
        let hot_ids: HashSet<String> =
            self.try_query(&format!("SELECT request_id FROM {}", s.qualified_table())).expect("hot ids").lines().map(str::to_owned).collect();
        let hot_rows = self.query_u64(&format!("SELECT count() FROM {}", s.qualified_table()));
        let today_ids: HashSet<String> = by_day[&today()].iter().map(|e| e.request_id.clone()).collect();
        assert_eq!(hot_rows as usize, hot_ids.len(), "no duplicate hot rows");
        assert_eq!(hot_ids, today_ids, "the hot tier holds exactly today's events");

        // Cold: exactly the released days' events, read back by pyarrow.
        let archive = s.read_archive(0);
        let objects = archive.as_array().expect("objects");
        let cold_rows: u64 = objects.iter().map(|o| o["num_rows"].as_u64().expect("rows")).sum();
        let cold_ids: HashSet<String> =
            objects.iter().flat_map(|o| o["request_ids"].as_array().expect("request ids")).map(|v| v.as_str().expect("id").to_owned()).collect();
        let released_ids: HashSet<String> = released.iter().flat_map(|d| by_day[d].iter().map(|e| e.request_id.clone())).collect();
        assert_eq!(cold_rows as usize, cold_ids.len(), "no duplicate cold rows");
        assert_eq!(cold_ids, released_ids, "the cold tier holds exactly the released days' events");
        let cold_tokens: u64 = objects.iter().map(|o| o["input_tokens_sum"].as_u64().expect("sum")).sum();
        let expected_tokens: u64 = released.iter().flat_map(|d| by_day[d].iter()).map(|e| u64::from(e.input_tokens)).sum();
        assert_eq!(cold_tokens, expected_tokens, "input tokens in the archive");

        // DLQ: every rejected event at least once, by source offset, with the
        // reason the generator broke it for (matched by the SHA-256 of the bytes).
        let dlq_messages = read_topic(&self.dlq);
        let sources = crate::dlq_sources(&dlq_messages);
        assert_eq!(sources.len(), rejected, "rejects in the DLQ");
        let reasons = expected_reasons(events);
        let mut seen_reasons = HashSet::new();
        for m in &dlq_messages {
            let sha = crate::original_sha256(m);
            let expected = reasons.get(sha).unwrap_or_else(|| panic!("a DLQ message that was not produced as invalid: {m}"));
            assert_eq!(m["headers"]["inferlog.reason"].as_str(), Some(expected.as_str()), "reason of {m}");
            assert!(!m["headers"]["inferlog.message"].as_str().unwrap_or("").is_empty(), "a DLQ message says why: {m}");
            seen_reasons.insert(expected.as_str());
        }
        if rejected >= 1_000 {
            assert_eq!(seen_reasons.len(), ReasonCode::EVENT.len(), "every rejection reason occurred: {seen_reasons:?}");
            assert!(dlq_messages.iter().any(|m| m["bytes"].as_u64().unwrap_or(0) > 65_536), "oversize messages reach the DLQ whole");
        }

        // The reconciliation the contract promises: the DLQ keeps what a
        // replay stored (nothing is deleted from it), so the events it still
        // holds as invalid are its sources less the recovered ones.
        assert_eq!(
            hot_rows + cold_rows + (sources.len() - recovered.len()) as u64,
            events.len() as u64,
            "produced = hot + cold + DLQ still invalid ({still_invalid}; {} replayed into hot and cold)",
            recovered.len()
        );

        // No plaintext user id or PII in the DLQ (`dlq_payload = "redacted"`,
        // the default): payloads, keys and headers of every message, against
        // the user ids of the input and the PII values the generator plants.
        let user_ids: HashSet<String> = events
            .iter()
            .filter_map(|e| serde_json::from_slice::<serde_json::Value>(&e.line).ok())
            .filter_map(|v| v.get("user_id").and_then(|u| u.as_str()).map(str::to_owned))
            .collect();
        let mut leaks = Vec::new();
        let full = crate::read_topic_values(&self.dlq);
        for m in &full {
            let text = format!("{} {} {}", m["value"], m["key"], m["headers"]);
            let tokens = text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'));
            leaks.extend(tokens.filter(|t| user_ids.contains(*t)).map(|t| format!("user id {t} at {}", m["offset"])));
            leaks.extend(["jane.doe@example.com", "415 555 0100"].iter().filter(|p| text.contains(**p)).map(|p| format!("{p} at {}", m["offset"])));
        }
        let redacted = full.iter().filter(|m| m["headers"]["inferlog.payload"] == "redacted").count();
        assert!(leaks.is_empty(), "plaintext personal data in the DLQ: {:?}", &leaks[..leaks.len().min(10)]);
        assert!(rejected < 100 || redacted * 2 > rejected, "most rejects carried a user id and were redacted: {redacted} of {rejected}");

        // No plaintext user id or PII in any tier: hot rows, the rejects log,
        // the archive, the aggregates.
        let text = "concat(request_id, '|', business_line, '|', model_name, '|', model_version, '|', ifNull(tenant, ''), '|', \
                    ifNull(session_id, ''), '|', ifNull(request_type, ''), '|', ifNull(error_stage, ''), '|', ifNull(user_id_hash, ''))";
        assert_eq!(self.query_u64(&format!("SELECT count() FROM {} WHERE match({text}, '{PLAINTEXT}')", s.qualified_table())), 0, "hot tier");
        let rejects = format!("inferlog_test.{}", self.rejects_table);
        assert_eq!(
            self.query_u64(&format!("SELECT count() FROM {rejects} WHERE match(concat(field, '|', message), '{PLAINTEXT}')")),
            0,
            "rejects log"
        );
        assert_eq!(self.query_u64(&format!("SELECT uniqExact(kafka_partition, kafka_offset) FROM {rejects}")), rejected as u64, "rejects logged");
        let cold_hits: u64 = objects.iter().map(|o| o["plaintext_hits"].as_u64().expect("hits")).sum();
        assert_eq!(cold_hits, 0, "cold tier");
        let pg_pattern = PLAINTEXT.replace("\\\\", "\\");
        assert_eq!(
            s.psql(&format!(
                "SELECT (SELECT count(*) FROM daily_aggregates WHERE concat_ws('|', business_line, model_name, model_version) ~ '{pg_pattern}') \
                      + (SELECT count(*) FROM daily_errors WHERE concat_ws('|', business_line, model_name, model_version, error_name, error_stage) ~ '{pg_pattern}')"
            )),
            "0",
            "aggregates tier"
        );

        // Aggregates of the released days equal the input's figures, per day and per business line.
        for day in &released {
            let d = &by_day[day];
            let expected = format!(
                "{}\t{}\t{}\t{}",
                d.len(),
                d.iter().filter(|e| e.error_code != 0).count(),
                d.iter().map(|e| u64::from(e.input_tokens)).sum::<u64>(),
                d.iter().map(|e| u64::from(e.output_tokens)).sum::<u64>()
            );
            let stored = s.psql(&format!(
                "SELECT sum(requests), sum(errors), sum(input_tokens), sum(output_tokens) FROM daily_aggregates WHERE day = '{}'",
                day_string(*day)
            ));
            assert_eq!(stored, expected, "aggregates of {}", day_string(*day));
            let by_line = s.psql(&format!(
                "SELECT business_line, sum(input_tokens) FROM daily_aggregates WHERE day = '{}' GROUP BY 1 ORDER BY 1",
                day_string(*day)
            ));
            let mut lines: BTreeMap<&str, u64> = BTreeMap::new();
            for e in d {
                *lines.entry(e.business_line.as_str()).or_default() += u64::from(e.input_tokens);
            }
            let expected_lines = lines.iter().map(|(l, t)| format!("{l}\t{t}")).collect::<Vec<_>>().join("\n");
            assert_eq!(by_line, expected_lines, "token use by business line on {}", day_string(*day));
        }

        // And the retention promise holds across every tier.
        let later = Pipeline::later();
        let audit = self.output("inferlog-retention", &["audit", "--now", &later], "audit.log");
        assert_eq!(audit.status.code(), Some(0), "audit at {later}: {}\n{}", String::from_utf8_lossy(&audit.stdout), s.log("audit.log"));
    }
}

/// A DLQ replay a test ran after fixing the config: the reason it replayed
/// and the contract that now accepts those events.
#[derive(Debug)]
pub struct Replayed {
    pub reason: ReasonCode,
    pub contract: ContractConfig,
}

/// The valid generated events, normalized as ingest would (the hash key does
/// not matter for any figure checked here).
pub fn normalized(events: &[GeneratedEvent]) -> Vec<InferenceEvent> {
    normalized_by(events, &ContractConfig::default(), None)
}

/// The generated events the default contract refuses with `expected`
/// (`None`: accepts), normalized under `contract`, which must accept them.
fn normalized_by(events: &[GeneratedEvent], contract: &ContractConfig, expected: Option<ReasonCode>) -> Vec<InferenceEvent> {
    let contract = Contract::new(contract).expect("contract");
    let hasher = UserIdHasher::new(HASH_KEY.as_bytes(), None, "test").expect("hasher");
    events
        .iter()
        .filter(|e| e.expected == expected)
        .map(|e| contract.normalize(&e.line, None, &hasher).expect("the contract accepts the event").event)
        .collect()
}

fn services_sh(action: &str) -> std::process::ExitStatus {
    Command::new("bash").arg(crate::repo_root().join("deploy/local/services.sh")).args(action.split_whitespace()).status().expect("services.sh")
}

/// Runs `deploy/local/services.sh ACTION` (stop, start or restart a shared
/// server; words split on spaces, as `kill-node s1r2`) and asserts that it worked.
pub fn services(action: &str) {
    assert!(services_sh(action).success(), "services.sh {action}");
}

/// Runs `services.sh ACTION` when dropped: a test that stops a shared
/// server leaves it running however the test ends.
#[derive(Debug)]
pub struct OnDrop(pub &'static str);

impl Drop for OnDrop {
    fn drop(&mut self) {
        let _ = services_sh(self.0);
    }
}
