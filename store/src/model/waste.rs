//! The fold's account of tokens spent for nothing, part of the one fold
//! ([`crate::model::fold::DayFold::counting_waste`]). In: one UTC day's
//! rows ([`FoldRow`]: business line, hashed caller, request type, tokens,
//! cached prefix, prompt hash, output limit). Out: [`Waste`]:
//!
//! - per business line × prompt hash: requests, tokens and the hashed
//!   callers. A request is a *repeat* when its business line sent the same
//!   prompt earlier the same UTC day: of a prompt's n requests that day, the
//!   earliest is not a repeat and the n − 1 others are. Which one is the
//!   earliest is settled by (timestamp, tokens, uncached input), so the
//!   figures do not depend on the order rows are read in.
//! - per business line: requests, requests with a prompt hash, repeats,
//!   their tokens and the input tokens a prompt cache would not have had
//!   to prefill on them (input minus the prefix the cache already served);
//! - per business line × request type: the output-length histogram, and
//!   the requests that set `max_tokens` and ended at it (their output
//!   reached the limit).
//!
//! A row of weight above 1 (a sampled archive day) stands for requests
//! whose prompts the sample did not keep: such a day's waste is marked
//! [`Waste::sampled`] and its figures are not used.

use std::collections::HashMap;

use inferlog_schema::histogram::Histogram;

use crate::model::stored::FoldRow;
pub use crate::model::stored::NO_TYPE;

/// One prompt of one business line in a day.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptUse {
    pub requests: u64,
    /// Input plus output tokens of all its requests.
    pub tokens: u64,
    /// Input tokens not served from the prefix cache, of all its requests.
    pub uncached_input: u64,
    /// The earliest request: (timestamp, tokens, uncached input).
    pub first: (u64, u64, u64),
    /// Requests per hashed caller (`""`: no `user_id`).
    pub callers: Vec<(String, u64)>,
}

impl PromptUse {
    /// Requests after the day's first.
    pub fn repeats(&self) -> u64 {
        self.requests.saturating_sub(1)
    }

    /// Tokens of the repeats.
    pub fn repeat_tokens(&self) -> u64 {
        self.tokens - self.first.1
    }

    /// Input tokens of the repeats a prompt cache would have saved.
    pub fn repeat_uncached_input(&self) -> u64 {
        self.uncached_input - self.first.2
    }
}

/// A business line's day (`+=` adds another's, field by field).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, derive_more::AddAssign, serde::Serialize, serde::Deserialize)]
pub struct LineWaste {
    pub requests: u64,
    /// Input plus output tokens of every request.
    pub tokens: u64,
    pub input_tokens: u64,
    /// Requests that carried a prompt hash.
    pub hashed: u64,
    pub repeats: u64,
    /// Input plus output tokens of the repeats.
    pub repeat_tokens: u64,
    /// Input tokens of the repeats not served from the prefix cache: what
    /// a cache of whole prompts would have saved in prefill.
    pub repeat_uncached_input: u64,
}

/// One request type's day of output lengths (`+=` adds another's, the
/// histograms merged).
#[derive(Debug, Clone, Default, PartialEq, derive_more::AddAssign, serde::Serialize, serde::Deserialize)]
pub struct TypeWaste {
    pub requests: u64,
    pub output_tokens: u64,
    /// Output tokens per request.
    pub outputs: Histogram,
    /// Requests that set `max_tokens`.
    pub limited: u64,
    /// Of those, the requests whose output reached it, and their output tokens.
    pub at_limit: u64,
    pub at_limit_tokens: u64,
}

/// A line's repeated prompts, as counted over a whole day (by the fold,
/// or by ClickHouse for a day folded in units).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LineRepeats {
    pub repeats: u64,
    pub repeat_tokens: u64,
    pub repeat_uncached_input: u64,
}

/// A day's waste.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Waste {
    /// The day was read from a sample: its figures are not used.
    pub sampled: bool,
    pub lines: HashMap<String, LineWaste>,
    /// Prompts sent more than once by a line: (business line, prompt hash).
    /// Empty for a day the aggregates answer: they keep no prompts.
    pub repeated: HashMap<(String, String), PromptUse>,
    /// Per (business line, request type).
    pub types: HashMap<(String, String), TypeWaste>,
}

impl Waste {
    /// Adds `other`'s lines and types to these (the day's rows in parts):
    /// everything but the repeats, which only the whole day's prompts
    /// tell ([`Waste::set_repeats`]); `repeated` is emptied.
    pub fn merge(&mut self, other: Waste) {
        self.sampled |= other.sampled;
        for (line, w) in other.lines {
            *self.lines.entry(line).or_default() += w;
        }
        for (key, t) in other.types {
            *self.types.entry(key).or_default() += t;
        }
        self.repeated.clear();
    }

    /// Sets each line's repeats to the whole day's (`repeats` per line;
    /// a line not listed repeated nothing). The prompts themselves are not
    /// kept (`repeated` stays empty: the aggregates keep no prompts).
    pub fn set_repeats(&mut self, repeats: &HashMap<String, LineRepeats>) {
        for (name, line) in &mut self.lines {
            let r = repeats.get(name).copied().unwrap_or_default();
            (line.repeats, line.repeat_tokens, line.repeat_uncached_input) = (r.repeats, r.repeat_tokens, r.repeat_uncached_input);
        }
        self.repeated.clear();
    }
}

/// The fold's own maps: hashed with foldhash, seeded per process, instead
/// of SipHash (2% of the compactor's CPU; the keys are the day's own
/// business lines, prompt hashes and request types).
type FoldMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The waste part of a day's fold.
#[derive(Debug, Default)]
pub struct WasteFold {
    sampled: bool,
    lines: FoldMap<String, LineWaste>,
    /// Per business line, per prompt hash: both keys are allocated on
    /// their first row only.
    prompts: FoldMap<String, FoldMap<String, PromptUse>>,
    /// Per business line, per request type.
    types: FoldMap<String, FoldMap<String, TypeWaste>>,
}

impl WasteFold {
    /// Counts one row standing for `weight` requests.
    pub fn add(&mut self, row: &FoldRow<'_>, weight: u64) {
        if weight != 1 {
            self.sampled = true;
            return;
        }
        let tokens = u64::from(row.input_tokens) + u64::from(row.output_tokens);
        let uncached = u64::from(row.input_tokens.saturating_sub(row.cache_prefix_tokens.unwrap_or(0)));
        let line = entry(&mut self.lines, row.business_line);
        line.requests += 1;
        line.tokens += tokens;
        line.input_tokens += u64::from(row.input_tokens);
        if let Some(prompt) = row.prompt_hash.filter(|p| !p.is_empty()) {
            line.hashed += 1;
            let p = entry(entry(&mut self.prompts, row.business_line), prompt);
            let this = (row.timestamp_ms, tokens, uncached);
            if p.requests == 0 || this < p.first {
                p.first = this;
            }
            p.requests += 1;
            p.tokens += tokens;
            p.uncached_input += uncached;
            let caller = row.user_id_hash.unwrap_or("");
            match p.callers.iter_mut().find(|(c, _)| c == caller) {
                Some(c) => c.1 += 1,
                None => p.callers.push((caller.to_owned(), 1)),
            }
        }
        let t = entry(entry(&mut self.types, row.business_line), row.request_type_or_none());
        t.requests += 1;
        t.output_tokens += u64::from(row.output_tokens);
        t.outputs.add(f64::from(row.output_tokens));
        if let Some(limit) = row.max_tokens {
            t.limited += 1;
            if row.output_tokens >= limit {
                t.at_limit += 1;
                t.at_limit_tokens += u64::from(row.output_tokens);
            }
        }
    }

    /// The day's waste: the repeats added to their lines, and only the
    /// prompts sent more than once kept.
    pub fn finish(mut self) -> Waste {
        let mut repeated = HashMap::new();
        for (line_name, prompts) in self.prompts {
            for (prompt, p) in prompts {
                if p.requests < 2 {
                    continue;
                }
                let line = entry(&mut self.lines, &line_name);
                line.repeats += p.repeats();
                line.repeat_tokens += p.repeat_tokens();
                line.repeat_uncached_input += p.repeat_uncached_input();
                repeated.insert((line_name.clone(), prompt), p);
            }
        }
        let types = self.types.into_iter().flat_map(|(line, types)| types.into_iter().map(move |(t, w)| ((line.clone(), t), w))).collect();
        Waste { sampled: self.sampled, lines: self.lines.into_iter().collect(), repeated, types }
    }
}

/// `map[key]`, allocating the key only for its first row.
fn entry<'m, V: Default>(map: &'m mut FoldMap<String, V>, key: &str) -> &'m mut V {
    if !map.contains_key(key) {
        map.insert(key.to_owned(), V::default());
    }
    map.get_mut(key).unwrap_or_else(|| unreachable!("inserted above"))
}

#[cfg(test)]
mod tests {
    use rand::seq::SliceRandom;
    use rand::Rng;

    use super::*;

    fn row<'a>(line: &'a str, ts: u64, prompt: Option<&'a str>, caller: &'a str, input: u32, output: u32) -> FoldRow<'a> {
        FoldRow {
            business_line: line,
            timestamp_ms: ts,
            prompt_hash: prompt,
            user_id_hash: Some(caller).filter(|c| !c.is_empty()),
            input_tokens: input,
            output_tokens: output,
            cache_prefix_tokens: Some(10),
            request_type: Some("chat"),
            max_tokens: Some(100),
            error_code: 0,
            error_stage: None,
            model_name: "m",
            model_version: "v1",
            total_latency_ms: 1.0,
            queue_wait_ms: None,
            prefill_time_ms: None,
            decode_time_ms: None,
            ttft_ms: None,
            tpot_ms: None,
            gpu_id: None,
            cache_hit: None,
            gpu_mem_peak_mb: None,
        }
    }

    #[test]
    fn repeats_are_a_lines_requests_after_its_first_of_the_prompt() {
        let mut fold = WasteFold::default();
        // p1: three times by search (the earliest at t=5), once by ads (not a repeat there).
        for r in [
            row("search", 9, Some("p1"), "u1", 110, 100),
            row("search", 5, Some("p1"), "u1", 100, 50),
            row("search", 7, Some("p1"), "u2", 120, 30),
            row("ads", 8, Some("p1"), "u3", 100, 20),
            row("search", 6, Some("p2"), "", 40, 5),
            row("search", 6, None, "u1", 40, 5),
        ] {
            fold.add(&r, 1);
        }
        let w = fold.finish();
        let search = w.lines["search"];
        assert_eq!((search.requests, search.hashed, search.repeats), (5, 4, 2));
        assert_eq!(search.repeat_tokens, (110 + 100) + (120 + 30), "every request of p1 but the earliest");
        assert_eq!(search.repeat_uncached_input, (110 - 10) + (120 - 10));
        assert_eq!(w.lines["ads"].repeats, 0, "another line's first request of a prompt is no repeat");
        assert_eq!(w.repeated.len(), 1, "only prompts sent twice are kept");
        let p1 = &w.repeated[&("search".to_owned(), "p1".to_owned())];
        assert_eq!(p1.callers, [("u1".to_owned(), 2), ("u2".to_owned(), 1)]);
        let chat = &w.types[&("search".to_owned(), "chat".to_owned())];
        assert_eq!((chat.requests, chat.limited, chat.at_limit, chat.at_limit_tokens), (5, 5, 1, 100));
        assert_eq!(chat.outputs.count(), 5);
        assert_eq!(w.types[&("ads".to_owned(), "chat".to_owned())].requests, 1, "per line");
    }

    #[test]
    fn the_order_of_rows_does_not_change_the_waste() {
        let (seed, mut rng) = crate::model::seeded_rng();
        let prompts = ["a", "b", "c", "d"];
        let mut rows: Vec<FoldRow<'_>> = (0..500)
            .map(|_| {
                let prompt = rng.gen_bool(0.8).then(|| prompts[rng.gen_range(0..4)]);
                let mut r = row(["x", "y"][rng.gen_range(0..2)], rng.gen_range(0..50), prompt, "", rng.gen_range(10..200), rng.gen_range(0..300));
                r.request_type = [None, Some("chat"), Some("")][rng.gen_range(0..3)];
                r
            })
            .collect();
        let fold = |rows: &[FoldRow<'_>]| {
            let mut f = WasteFold::default();
            rows.iter().for_each(|r| f.add(r, 1));
            let mut w = f.finish();
            w.repeated.values_mut().for_each(|p| p.callers.sort());
            w
        };
        let first = fold(&rows);
        rows.shuffle(&mut rng);
        assert_eq!(fold(&rows), first, "seed {seed}");
        let hashed: u64 = first.lines.values().map(|l| l.hashed).sum();
        let repeats: u64 = first.lines.values().map(|l| l.repeats).sum();
        let distinct: std::collections::BTreeSet<_> = rows.iter().filter_map(|r| Some((r.business_line, r.prompt_hash?))).collect();
        assert_eq!(hashed - repeats, distinct.len() as u64, "one first request per line and prompt (seed {seed})");
        let untyped: u64 = first.types.iter().filter(|((_, t), _)| t == NO_TYPE).map(|(_, w)| w.requests).sum();
        assert_eq!(untyped, rows.iter().filter(|r| r.request_type.is_none_or(str::is_empty)).count() as u64);
    }

    #[test]
    fn a_weighted_row_marks_the_day_sampled() {
        let mut fold = WasteFold::default();
        fold.add(&row("x", 1, Some("a"), "", 1, 1), 3);
        let w = fold.finish();
        assert!(w.sampled && w.lines.is_empty());
    }
}
