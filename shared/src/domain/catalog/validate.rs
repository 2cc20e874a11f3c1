//! The catalog's rules, section by section (docs/architecture.md#configuration). Each reader records
//! every problem it finds and returns what it could build; the [`Catalog`] is
//! assembled only when there were no problems at all.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value as Json;
use toml::{Table, Value};

use super::read::{Fields, KeyPath, Problems, bounded};
use super::uploads::uploads;
use super::{Asset, Catalog, Executor, Meter, NetworkKind, Payments, Price, Problem, Quota, TaskSpec, Unit};
use super::{amount, formats, schema};

const ROOT_KEYS: &[&str] = &["payments", "uploads", "limits", "assets", "tasks"];
const LIMITS_KEYS: &[&str] = &["running_per_space"];
/// A limit no worker fleet could reach is a typo, not a setting.
const MAX_RUNNING_PER_SPACE: i64 = 10_000;
const ASSET_KEYS: &[&str] = &["network", "contract", "decimals", "usd_peg", "eip2612", "name", "version"];
/// The keys every kind may have, around the executors' own ([`Executor::keys`]),
/// in the order an unknown key's message lists them.
const TASK_KEYS: (&[&str], &[&str]) = (
    &["title", "description", "executor"],
    &["timeout_seconds", "input_schema", "accepts", "quota", "running_per_space"],
);
const QUOTA_KEYS: &[&str] = &["per_hour", "at_once"];
/// A quota is a ceiling: one no space could reach is a typo, not a setting.
const MAX_QUOTA_PER_HOUR: i64 = 1_000_000;
const MAX_QUOTA_AT_ONCE: i64 = 10_000;
const PRICE_KEYS: &[&str] = &["asset", "scheme", "amount", "amount_usd", "unit", "rate", "rate_usd"];
const PAYMENTS_KEYS: &[&str] = &[
    "network_kind",
    "pay_to",
    "facilitator_url",
    "max_timeout_seconds",
    "metered_queue_seconds",
    "receipt_signer",
    "batch_receiver_authorizer",
    "batch_withdraw_delay_seconds",
];
/// How long a metered task may wait in the queue, within its authorization.
const DEFAULT_METERED_QUEUE_SECONDS: u32 = 600;

const DEFAULT_TASK_TIMEOUT_SECONDS: u32 = 60;
/// Lambda's maximum run time; the worker runs tasks inside one invocation.
pub(super) const MAX_TASK_TIMEOUT_SECONDS: i64 = 900;
/// The longest a kind whose service reports on its own may run (12 hours):
/// the worker does not wait for it, so no invocation bounds it; what does
/// is the life of the links its job carries (signed by the worker, with
/// credentials that may be temporary) and, for a metered kind, its payment
/// authorization.
pub const MAX_DELEGATED_TIMEOUT_SECONDS: i64 = 43_200;
/// How long the worker waits for such a service's answer to the job (a
/// `200` with the result, or a `202`): what must fit in its invocation.
pub const DELEGATED_CALL_SECONDS: u32 = 300;
/// What a worker keeps beyond a task's `timeout_seconds`: time to claim it
/// and record its outcome before its invocation ends, with room for the
/// record to wait its turn in a batch. A worker claims a record only with
/// the timeout plus its own (smaller) deadline margin left, so a kind that
/// fits with this margin is always claimed by a fresh invocation.
pub const RUN_MARGIN_SECONDS: u32 = 30;
const DEFAULT_PAYMENT_TIMEOUT_SECONDS: u32 = 300;

/// A run and the recording of its outcome happen in one worker invocation
/// of at most `worker_timeout` seconds: a kind that cannot finish in it
/// would never be claimed (or, claimed, be killed by Lambda every time, its
/// attempts used up for nothing).
fn fits_the_worker(secs: u32, worker_timeout: u32) -> Result<u32, String> {
    if secs + RUN_MARGIN_SECONDS <= worker_timeout {
        Ok(secs)
    } else {
        Err(format!(
            "{secs} s plus the worker's {RUN_MARGIN_SECONDS} s margin is more than the worker's time limit \
             ({worker_timeout} s, its function's Timeout): at most {}",
            worker_timeout.saturating_sub(RUN_MARGIN_SECONDS)
        ))
    }
}
const MAX_PAYMENT_TIMEOUT_SECONDS: i64 = 3600;
/// An ERC-20 token with more decimals than this does not exist in practice,
/// and 10^36 still leaves room in a `u128`.
const MAX_DECIMALS: i64 = 36;

/// What a load does with each kind's input schema once it is JSON, given
/// the kind: compiles (and keeps) it, or nothing, for a load that serves
/// the schemas without validating inputs. The caller passes it, so only the
/// loads that compile reach a compiler. An `Err` is a problem at the
/// kind's `input_schema`.
pub type SchemaCheck<'a> = &'a mut dyn FnMut(&str, &Json) -> Result<(), String>;

/// `worker_timeout`: the worker's time limit in seconds, which every
/// task's timeout (plus [`RUN_MARGIN_SECONDS`]) must fit in.
pub fn catalog(table: &Table, worker_timeout: u32, check: SchemaCheck) -> Result<Catalog, Vec<Problem>> {
    let mut problems = Problems::new();
    let p = &mut problems;
    let root = Fields::new(KeyPath::default(), table);
    root.deny_unknown(ROOT_KEYS, p);

    let assets = assets(&root, p);
    let tasks = root
        .entries("tasks", p)
        .into_iter()
        .filter_map(|(kind, fields)| Some((kind.to_owned(), task(kind, &fields, &assets, worker_timeout, check, p)?)))
        .collect();
    let payments = payments(&root, &priced_tasks(table), p);
    let uploads = uploads(&root, p);
    let running_per_space = limits(&root, p);

    batch_needs_authorizer(&tasks, payments.as_ref(), p);

    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(Catalog { assets: assets.valid, tasks, payments, uploads, running_per_space })
}

/// The escrow's bounds on a channel's withdraw delay (seconds): a channel
/// outside them can never be deposited into.
const BATCH_WITHDRAW_DELAY_SECONDS: std::ops::RangeInclusive<i64> = 15 * 60..=30 * 24 * 60 * 60;
/// A day: long enough for Reeve to claim after a payer asks to withdraw,
/// short enough for a payer to get back an idle deposit the same week.
const DEFAULT_BATCH_WITHDRAW_DELAY_SECONDS: u64 = 24 * 60 * 60;

/// Every `scheme = "batch"` price needs `[payments]
/// batch_receiver_authorizer`: a channel names it, and without it no offer
/// could be made.
fn batch_needs_authorizer(tasks: &BTreeMap<String, TaskSpec>, payments: Option<&Payments>, p: &mut Problems) {
    if payments.is_none_or(|payments| payments.batch_receiver_authorizer.is_some()) {
        return;
    }
    for (kind, task) in tasks {
        if let Some(index) = task.accepts.iter().position(|price| price.batch) {
            p.push(Problem {
                path: format!("tasks.{kind}.accepts[{index}].scheme"),
                message: "a batch price needs [payments] batch_receiver_authorizer, the address that authorizes \
                          Reeve's claims on the payer's channel"
                    .into(),
            });
        }
    }
}

/// `[limits]`: how many of one Space's tasks may run at once, so that one
/// Space's backlog cannot hold every worker (docs/operations.md#fairness).
fn limits(root: &Fields, p: &mut Problems) -> u32 {
    let Some(f) = root.table("limits", p) else {
        return super::DEFAULT_RUNNING_PER_SPACE;
    };
    f.deny_unknown(LIMITS_KEYS, p);
    f.int_in("running_per_space", 1..=MAX_RUNNING_PER_SPACE, p).unwrap_or(super::DEFAULT_RUNNING_PER_SPACE)
}

/// The assets as prices need them: every declared id, so that a price naming
/// a broken asset is not also told the asset is unknown, and the valid ones.
struct Assets {
    declared: BTreeSet<String>,
    valid: BTreeMap<String, Asset>,
}

fn assets(root: &Fields, p: &mut Problems) -> Assets {
    let mut assets = Assets { declared: BTreeSet::new(), valid: BTreeMap::new() };
    for (id, fields) in root.entries("assets", p) {
        assets.declared.insert(id.to_owned());
        if let Some(asset) = asset(id, &fields, p) {
            assets.valid.insert(id.to_owned(), asset);
        }
    }
    assets
}

fn asset(id: &str, f: &Fields, p: &mut Problems) -> Option<Asset> {
    f.deny_unknown(ASSET_KEYS, p);
    let id = f.path.verify(formats::id("asset id", id), p);
    let network = f
        .required::<&str>("network", p)
        .and_then(|network| f.verify("network", formats::caip2(network), p).map(|()| network));
    let contract = f.required::<&str>("contract", p).and_then(|contract| {
        let checked = match network {
            Some(network) if formats::is_evm(network) => formats::evm_address(contract),
            _ => formats::non_blank(contract),
        };
        f.verify("contract", checked, p).map(|()| contract)
    });
    let decimals = f.required("decimals", p).and_then(|n| f.verify("decimals", bounded(n, 0..=MAX_DECIMALS), p));
    let usd_peg = f.optional("usd_peg", p).unwrap_or(false);
    // USDC and its kin have it; a token without it says so.
    let eip2612 = f.optional("eip2612", p).unwrap_or(true);
    let name = required_text(f, "name", p);
    let version = required_text(f, "version", p);

    id?;
    Some(Asset {
        network: network?.to_owned(),
        contract: contract?.to_owned(),
        decimals: decimals?,
        usd_peg,
        eip2612,
        name: name?,
        version: version?,
    })
}

/// Kinds that would be shadowed by a route of their own: `POST
/// /v1/tasks/cancel` is the bulk cancel, not a create of kind `cancel`.
const RESERVED_KINDS: &[&str] = &["cancel"];

fn not_reserved(kind: &str) -> Result<(), String> {
    match RESERVED_KINDS.contains(&kind) {
        true => {
            Err(format!("task kind {kind:?} is reserved: POST /v1/tasks/{kind} is another route; name it otherwise"))
        }
        false => Ok(()),
    }
}

fn task(
    kind: &str,
    f: &Fields,
    assets: &Assets,
    worker_timeout: u32,
    check: SchemaCheck,
    p: &mut Problems,
) -> Option<TaskSpec> {
    let (before, after) = TASK_KEYS;
    let own = Executor::keys().map(|key| key.key);
    let keys: Vec<&str> = before.iter().copied().chain(own).chain(after.iter().copied()).collect();
    f.deny_unknown(&keys, p);
    let named = f.path.verify(formats::id("task kind", kind).and_then(|()| not_reserved(kind)), p);
    let title = required_text(f, "title", p);
    let description = f.optional::<&str>("description", p).unwrap_or_default();
    let executor = Executor::configure(f, p);
    // A kind whose service may answer 202 holds the worker only for that
    // answer: that, not its whole timeout, must fit in the worker.
    let delegates = executor.as_ref().is_some_and(Executor::delegates);
    let most = if delegates { MAX_DELEGATED_TIMEOUT_SECONDS } else { MAX_TASK_TIMEOUT_SECONDS };
    let timeout_seconds = f
        .int_in("timeout_seconds", 1..=most, p)
        .and_then(|secs: u32| {
            let waited = if delegates { secs.min(DELEGATED_CALL_SECONDS) } else { secs };
            f.verify("timeout_seconds", fits_the_worker(waited, worker_timeout).map(|_| secs), p)
        })
        .unwrap_or(DEFAULT_TASK_TIMEOUT_SECONDS);
    let schema = f.required("input_schema", p).and_then(|schema| {
        let json = schema::read(schema).and_then(|json| {
            check(kind, &json)?;
            schema::takes_an_object(&json).map(|()| json)
        });
        f.verify("input_schema", json, p)
    });
    let listed = f.optional::<&[Value]>("accepts", p);
    let accepts = match listed {
        Some(items) => prices(&f.at("accepts"), items, assets, executor.as_ref(), p),
        None => Some(Vec::new()),
    };
    let quota = quota(f, listed.is_some_and(|items| !items.is_empty()), p);
    // The kind's own limit, counted over its own running tasks only.
    let running_per_space = f.int_in("running_per_space", 1..=MAX_RUNNING_PER_SPACE, p);

    named?;
    Some(TaskSpec {
        title: title?,
        description: description.to_owned(),
        executor: executor?,
        timeout_seconds,
        input_schema: schema?,
        // Set by the load that compiled it, if one did.
        #[cfg(feature = "input-schemas")]
        input_validator: None,
        accepts: accepts?,
        quota,
        running_per_space,
    })
}

/// `[tasks.<kind>.quota]`: only a free task has one, and it always does
/// (the defaults when the table is left out); `None` for a priced task.
fn quota(f: &Fields, priced: bool, p: &mut Problems) -> Option<Quota> {
    let Some(q) = f.table("quota", p) else {
        return (!priced).then(Quota::default);
    };
    if priced {
        q.path.report(p, "only a free task has a quota; a priced task is limited by its payment");
        return None;
    }
    q.deny_unknown(QUOTA_KEYS, p);
    let defaults = Quota::default();
    Some(Quota {
        per_hour: q.int_in("per_hour", 1..=MAX_QUOTA_PER_HOUR, p).unwrap_or(defaults.per_hour),
        at_once: q.int_in("at_once", 1..=MAX_QUOTA_AT_ONCE, p).unwrap_or(defaults.at_once),
    })
}

/// `None` if any entry is broken; each broken entry has been reported. A
/// task's prices are all `exact` or all metered: a payer offered both would
/// pick one, and the task would be charged by a rule its catalog view does
/// not single out.
fn prices(
    path: &KeyPath,
    items: &[Value],
    assets: &Assets,
    executor: Option<&Executor>,
    p: &mut Problems,
) -> Option<Vec<Price>> {
    let mut seen = BTreeSet::new();
    let prices: Vec<Option<Price>> = items
        .iter()
        .enumerate()
        .map(|(index, item)| price(&Fields::of(path.index(index), item, p)?, assets, executor, &mut seen, p))
        .collect();
    let prices: Option<Vec<Price>> = prices.into_iter().collect();
    if let Some(prices) = &prices
        && let Some(first) = prices.first()
        && let Some(index) = prices.iter().position(|price| price.scheme() != first.scheme())
    {
        let (one, other) = (first.scheme(), prices[index].scheme());
        path.index(index).report(
            p,
            format!(
                "scheme {other:?} differs from accepts[0]'s {one:?}; a task's prices are all exact, all upto or all \
                 batch"
            ),
        );
        return None;
    }
    prices
}

fn price<'a>(
    f: &Fields<'a>,
    assets: &Assets,
    executor: Option<&Executor>,
    seen: &mut BTreeSet<&'a str>,
    p: &mut Problems,
) -> Option<Price> {
    f.deny_unknown(PRICE_KEYS, p);
    let id = f.required::<&str>("asset", p).and_then(|id| {
        let checked = if !assets.declared.contains(id) {
            Err(format!("unknown asset {id:?}"))
        } else if !seen.insert(id) {
            Err(format!("asset {id:?} is listed twice in this task's accepts"))
        } else {
            Ok(id)
        };
        f.verify("asset", checked, p)
    });
    // Present but broken assets were reported in [assets]; prices in them
    // are still checked as far as possible without the asset.
    let asset = id.and_then(|id| Some((id, assets.valid.get(id)?)));
    let (metered, batch) = match f.optional::<&str>("scheme", p) {
        None | Some("exact") => (false, false),
        Some("upto") => (true, false),
        Some("batch") => (false, true),
        Some(other) => {
            f.at("scheme").report(p, format!("unknown scheme {other:?} (known: exact, upto, batch)"));
            return None;
        }
    };
    if batch
        && let Some((id, asset)) = asset
        && !formats::is_evm(&asset.network)
    {
        f.at("scheme").report(p, format!("asset {id:?} is not on an EVM network; batch pays through an EVM escrow"));
        return None;
    }
    let meter = if metered {
        meter(f, asset, executor, p).map(Some)
    } else {
        for key in ["unit", "rate", "rate_usd"] {
            if f.has(key) {
                f.at(key).report(p, "only a metered price (scheme = \"upto\") has a unit and a rate");
            }
        }
        Some(None)
    };
    // The price of an exact price; the ceiling per task of a metered one.
    let amount = amount_of(f, "amount", asset, p);
    let (amount, amount_usd) = amount?;
    let meter = meter?;
    if let Some(meter) = &meter
        && amount < meter.rate
    {
        f.path.report(p, "the ceiling (amount) is less than one unit's rate; no task could use a single unit");
        return None;
    }
    Some(Price { asset: id?.to_owned(), amount, amount_usd, meter, batch })
}

/// The unit and rate of a metered price: a unit its executor measures, a
/// rate of at least one atomic unit, on an EVM asset (x402's `upto` pays
/// through Permit2).
fn meter(f: &Fields, asset: Option<(&str, &Asset)>, executor: Option<&Executor>, p: &mut Problems) -> Option<Meter> {
    let unit = f.required::<&str>("unit", p).and_then(|name| {
        let known = || Unit::ALL.map(Unit::name).join(", ");
        let checked = match (Unit::parse(name), executor) {
            (None, _) => Err(format!(
                "unknown unit {name:?} (known: {}; or, for a kind whose service reports, a unit of its own: \
                 lowercase letters and _, at most 32)",
                known()
            )),
            (Some(unit), Some(executor)) if !executor.meters(unit) => {
                let measured: Vec<&str> =
                    Unit::ALL.into_iter().filter(|u| executor.meters(*u)).map(Unit::name).collect();
                Err(format!(
                    "executor {:?} does not measure {name:?}; it measures {}",
                    executor.name(),
                    measured.join(", ")
                ))
            }
            (Some(unit), _) => Ok(unit),
        };
        f.verify("unit", checked, p)
    });
    let rate = amount_of(f, "rate", asset, p);
    if let Some((id, asset)) = asset
        && !formats::is_evm(&asset.network)
    {
        f.at("scheme").report(p, format!("asset {id:?} is not on an EVM network; upto pays through Permit2"));
        return None;
    }
    let (rate, rate_usd) = rate?;
    Some(Meter { unit: unit?, rate, rate_usd })
}

/// `key` (atomic units) or `key_usd`, exactly one of them.
fn amount_of(f: &Fields, key: &str, asset: Option<(&str, &Asset)>, p: &mut Problems) -> Option<(u128, Option<String>)> {
    let usd_key = format!("{key}_usd");
    match (f.has(key), f.has(&usd_key)) {
        (true, true) => {
            f.path.report(p, format!("both {key} and {usd_key} are set; set exactly one"));
            None
        }
        (false, false) => {
            f.path.report(p, format!("neither {key} nor {usd_key} is set; set exactly one"));
            None
        }
        (true, false) => f
            .optional::<&str>(key, p)
            .and_then(|amount| f.verify(key, amount::atomic(amount), p))
            .map(|atomic| (atomic, None)),
        (false, true) => usd_price(f, &usd_key, asset, p),
    }
}

/// Resolves `key` (`amount_usd`, `rate_usd`) to atomic units, returning
/// it with the text as written.
fn usd_price(f: &Fields, key: &str, asset: Option<(&str, &Asset)>, p: &mut Problems) -> Option<(u128, Option<String>)> {
    let written = f.optional::<&str>(key, p)?;
    let usd = f.verify(key, amount::usd(written), p)?;
    let (id, asset) = asset?;
    if !asset.usd_peg {
        let atomic = key.trim_end_matches("_usd");
        f.at(key).report(
            p,
            format!(
                "asset {id:?} is not marked usd_peg = true, so it cannot be priced in USD; use {atomic} (atomic units)"
            ),
        );
        return None;
    }
    let atomic = f.verify(key, usd.to_atomic(asset.decimals), p)?;
    if atomic == 0 {
        let decimals = asset.decimals;
        f.at(key).report(p, format!("{key} {written:?} is 0 atomic units of {id} ({decimals} decimals)"));
        return None;
    }
    Some((atomic, Some(written.to_owned())))
}

/// Kinds with a non-empty `accepts`, read from the raw TOML so that a priced
/// task with other mistakes still makes `[payments]` required.
fn priced_tasks(root: &Table) -> Vec<&str> {
    let Some(tasks) = root.get("tasks").and_then(Value::as_table) else {
        return Vec::new();
    };
    tasks
        .iter()
        .filter(|(_, task)| task.get("accepts").and_then(Value::as_array).is_some_and(|accepts| !accepts.is_empty()))
        .map(|(kind, _)| kind.as_str())
        .collect()
}

fn payments(root: &Fields, priced: &[&str], p: &mut Problems) -> Option<Payments> {
    if !root.has("payments") {
        if !priced.is_empty() {
            let priced = priced.join(", ");
            root.at("payments")
                .report(p, format!("missing; priced tasks ({priced}) need [payments] with pay_to and facilitator_url"));
        }
        return None;
    }
    let f = root.table("payments", p)?;
    f.deny_unknown(PAYMENTS_KEYS, p);
    let pay_to = f
        .required::<&str>("pay_to", p)
        .and_then(|address| f.verify("pay_to", formats::evm_address(address), p).map(|()| address));
    let facilitator_url = f
        .required::<&str>("facilitator_url", p)
        .and_then(|url| f.verify("facilitator_url", facilitator_url(url), p).map(|()| url));
    let max_timeout_seconds =
        f.int_in("max_timeout_seconds", 1..=MAX_PAYMENT_TIMEOUT_SECONDS, p).unwrap_or(DEFAULT_PAYMENT_TIMEOUT_SECONDS);
    let metered_queue_seconds = f
        .int_in("metered_queue_seconds", i64::from(super::METERED_MIN_QUEUE_SECONDS)..=MAX_PAYMENT_TIMEOUT_SECONDS, p)
        .unwrap_or(DEFAULT_METERED_QUEUE_SECONDS);
    let network_kind = match f.optional::<&str>("network_kind", p) {
        Some(name) => f.verify("network_kind", NetworkKind::parse(name), p)?,
        None => NetworkKind::default(),
    };
    let receipt_signer = f
        .optional::<&str>("receipt_signer", p)
        .and_then(|address| f.verify("receipt_signer", formats::evm_address(address), p).map(|()| address.to_owned()));
    let batch_receiver_authorizer = f.optional::<&str>("batch_receiver_authorizer", p).and_then(|address| {
        f.verify("batch_receiver_authorizer", formats::evm_address(address), p).map(|()| address.to_owned())
    });
    let batch_withdraw_delay_seconds = f
        .int_in("batch_withdraw_delay_seconds", BATCH_WITHDRAW_DELAY_SECONDS, p)
        .unwrap_or(DEFAULT_BATCH_WITHDRAW_DELAY_SECONDS);

    Some(Payments {
        pay_to: pay_to?.to_owned(),
        facilitator_url: facilitator_url?.to_owned(),
        max_timeout_seconds,
        metered_queue_seconds,
        network_kind,
        receipt_signer,
        batch_receiver_authorizer,
        batch_withdraw_delay_seconds,
    })
}

/// Payment payloads travel to the facilitator, so they need TLS unless the
/// facilitator is on this machine (as in tests).
pub(crate) fn facilitator_url(url: &str) -> Result<(), String> {
    let parsed = formats::http_url(url)?;
    if parsed.https || formats::is_loopback(parsed.host) {
        Ok(())
    } else {
        Err(format!("{url:?} must use https (plain http only for 127.0.0.1, localhost or [::1])"))
    }
}

fn required_text(f: &Fields, key: &str, p: &mut Problems) -> Option<String> {
    let text = f.required::<&str>(key, p)?;
    f.verify(key, formats::non_blank(text), p)?;
    Some(text.to_owned())
}
