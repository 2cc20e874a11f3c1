//! Every executor Reeve has, listed once.
//!
//! [`registry!`] turns the list into the [`Executor`] a catalog entry
//! holds (one variant per executor, carrying its configuration), the names
//! and keys the catalog checks a kind's table against, and one dispatch per
//! declaration, and per run when the worker is built. A listed type that
//! does not declare itself ([`ExecutorKind`]) or, in the worker, cannot run
//! ([`TaskExecutor`]) does not compile; an executor that is not listed
//! cannot be named in `reeve.toml`.

use std::time::Duration;

use serde_json::Value;

#[cfg(feature = "worker")]
use super::{DelegatedAttempt, ExecDeps, ExecError, Job, TaskExecutor};
use super::{ExecutorKind, Report, TaskKey};
use super::{digest::Digest, fetch::Fetch, http::Http, lambda::Lambda};
use crate::domain::catalog::meter::{Quantity, Unit};
use crate::domain::catalog::read::{Fields, Problems};

/// Builds [`Executor`] and its dispatch from the listed types; each
/// variant is named as its type.
macro_rules! registry {
    ($($kind:ident),+ $(,)?) => {
        /// Which executor runs a kind, with its configuration (`[tasks.<kind>]`):
        /// one variant per registered executor.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum Executor {
            $($kind($kind)),+
        }

        $(impl From<$kind> for Executor {
            fn from(executor: $kind) -> Self {
                Executor::$kind(executor)
            }
        })+

        impl Executor {
            /// The name of every registered executor, in the order error
            /// messages list them.
            pub const NAMES: &'static [&'static str] = &[$(<$kind as ExecutorKind>::NAME),+];

            /// Each executor's own keys of a kind's table, by name.
            const KEYS: &'static [(&'static str, &'static [TaskKey])] =
                &[$((<$kind as ExecutorKind>::NAME, <$kind as ExecutorKind>::KEYS)),+];

            /// The name `executor` takes in `reeve.toml`: one of [`NAMES`](Self::NAMES).
            pub fn name(&self) -> &'static str {
                match self {
                    $(Executor::$kind(_) => <$kind as ExecutorKind>::NAME),+
                }
            }

            /// The executor called `name`, configured from its kind's table;
            /// `None` if no executor is called that.
            fn configure_named(name: &str, task: &Fields<'_>, p: &mut Problems) -> Option<Option<Executor>> {
                $(if name == <$kind as ExecutorKind>::NAME {
                    return Some(<$kind as ExecutorKind>::configure(task, p).map(Executor::$kind));
                })+
                None
            }

            /// What a metered price of this executor counts.
            pub fn measures(&self) -> Quantity {
                match self {
                    $(Executor::$kind(executor) => executor.measures()),+
                }
            }

            /// What a finished run used, in the quantity it [`measures`](Self::measures).
            pub fn used(&self, result: &Value, took: Duration) -> u64 {
                match self {
                    $(Executor::$kind(executor) => executor.used(result, took)),+
                }
            }

            /// The JSON Schema of a completed task's `result`.
            pub fn output_schema(&self) -> Value {
                match self {
                    $(Executor::$kind(executor) => executor.output_schema()),+
                }
            }

            /// Whether `report` may be shown before a metered task's payment
            /// is captured; anything else is held with the result.
            pub fn discloses(&self, report: &Report) -> bool {
                match self {
                    $(Executor::$kind(executor) => executor.discloses(report)),+
                }
            }

            /// Whether a run may be handed to a service that reports on
            /// its own ([`ExecutorKind::delegates`]).
            pub fn delegates(&self) -> bool {
                match self {
                    $(Executor::$kind(executor) => executor.delegates()),+
                }
            }

            /// Runs one job.
            #[cfg(feature = "worker")]
            pub(super) async fn run(&self, deps: &ExecDeps, job: &Job<'_>) -> Result<Value, ExecError> {
                match self {
                    $(Executor::$kind(executor) => executor.run(deps, job).await),+
                }
            }

            /// Tells a delegated attempt's service that it was canceled.
            #[cfg(feature = "worker")]
            pub(super) async fn cancel(&self, deps: &ExecDeps, attempt: &DelegatedAttempt<'_>) -> Result<(), ExecError> {
                match self {
                    $(Executor::$kind(executor) => executor.cancel(deps, attempt).await),+
                }
            }
        }
    };
}

registry!(Digest, Fetch, Http, Lambda);

impl Executor {
    /// The executor a kind's table names (`executor = "…"`), configured
    /// from that table. Every problem is reported at its TOML path: a name
    /// no executor has, the executor's own, and a key only other executors
    /// read.
    pub(crate) fn configure(task: &Fields<'_>, p: &mut Problems) -> Option<Executor> {
        let name = task.required::<&str>("executor", p)?;
        let Some(executor) = Executor::configure_named(name, task, p) else {
            let known = Executor::NAMES.join(", ");
            task.at("executor").report(p, format!("unknown executor {name:?} (known: {known})"));
            return None;
        };
        let own = Executor::KEYS.iter().find(|(owner, _)| *owner == name).map_or(&[][..], |(_, keys)| *keys);
        for key in Executor::keys() {
            if !task.has(key.key) || own.iter().any(|k| k.key == key.key) {
                continue;
            }
            let owners: Vec<String> = Executor::KEYS
                .iter()
                .filter(|(_, keys)| keys.iter().any(|k| k.key == key.key))
                .map(|(owner, _)| format!("{owner:?}"))
                .collect();
            let takes = match owners.as_slice() {
                [owner] => format!("executor {owner} takes"),
                owners => format!("executors {} take", owners.join(", ")),
            };
            task.at(key.key).report(p, format!("only {takes} {}, not {name:?}", key.noun));
        }
        executor
    }

    /// Every key that some executor reads from a kind's table, once each.
    pub(crate) fn keys() -> impl Iterator<Item = TaskKey> {
        let mut seen = Vec::new();
        Executor::KEYS.iter().flat_map(|(_, keys)| keys.iter().copied()).filter(move |key| {
            let new = !seen.contains(&key.key);
            seen.push(key.key);
            new
        })
    }

    /// Whether a metered price of this executor may count `unit`: what it
    /// measures, or (a kind whose service reports on its own) a unit the
    /// service counts itself.
    pub fn meters(&self, unit: Unit) -> bool {
        unit.quantity() == self.measures() || (unit.quantity() == Quantity::Reported && self.delegates())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use toml::Table;

    use super::*;
    use crate::domain::catalog::read::KeyPath;
    use crate::infra::json_schema::JsonSchema;

    /// A kind's table for the executor `name`, with an example of each of
    /// its own keys.
    fn minimal(name: &str) -> Table {
        let (_, keys) = Executor::KEYS.iter().find(|(owner, _)| *owner == name).unwrap();
        let mut text = format!("executor = {name:?}\n");
        for key in *keys {
            text.push_str(&format!("{} = {}\n", key.key, key.example));
        }
        text.parse().unwrap_or_else(|e| panic!("{name}'s examples are TOML: {e}"))
    }

    fn configure(table: &Table) -> (Option<Executor>, Problems) {
        let mut problems = Problems::new();
        let executor = Executor::configure(&Fields::new(KeyPath::default().key("t"), table), &mut problems);
        (executor, problems)
    }

    fn each() -> Vec<Executor> {
        Executor::NAMES
            .iter()
            .map(|name| {
                let (executor, problems) = configure(&minimal(name));
                assert!(problems.is_empty(), "{name}: {problems:?}");
                executor.unwrap_or_else(|| panic!("{name} is configured"))
            })
            .collect()
    }

    #[test]
    fn every_registered_name_configures_its_own_executor() {
        let names: Vec<&str> = each().iter().map(Executor::name).collect();
        assert_eq!(names, Executor::NAMES, "each name round-trips");
        assert_eq!(Executor::NAMES, ["digest", "fetch", "http", "lambda"], "the order error messages list them in");
        let mut unique = names.clone();
        unique.dedup();
        assert_eq!(unique, names, "no two executors share a name");

        let (none, problems) = configure(&"executor = \"shell\"".parse().unwrap());
        assert!(none.is_none());
        assert_eq!(problems[0].path, "t.executor");
        assert_eq!(problems[0].message, "unknown executor \"shell\" (known: digest, fetch, http, lambda)");
    }

    #[test]
    fn a_key_of_another_executor_is_refused_with_whose_it_is() {
        for name in Executor::NAMES {
            let mut table = minimal(name);
            for key in Executor::keys() {
                let example: Table = format!("{} = {}", key.key, key.example).parse().unwrap();
                table.extend(example);
            }
            let (_, problems) = configure(&table);
            for problem in &problems {
                assert!(problem.message.starts_with("only executor"), "{name}: {problem:?}");
                assert!(problem.message.ends_with(&format!("not {name:?}")), "{name}: {problem:?}");
            }
        }
        let (_, problems) = configure(&"executor = \"digest\"\nendpoint = \"https://x\"".parse().unwrap());
        let shown: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["t.endpoint: only executor \"http\" takes an endpoint, not \"digest\""]);
    }

    #[test]
    fn every_executor_meters_some_unit_and_reads_its_usage() {
        for executor in each() {
            let units: Vec<Unit> = Unit::ALL.into_iter().filter(|u| executor.meters(*u)).collect();
            assert!(!units.is_empty(), "{} can be priced in some unit", executor.name());
            assert!(units.iter().all(|u| u.quantity() == executor.measures()));
        }
        let took = Duration::from_millis(1500);
        let result = json!({ "size": 42 });
        let used: Vec<(&str, u64)> = each().iter().map(|e| (e.name(), e.used(&result, took))).collect();
        assert_eq!(used, [("digest", 42), ("fetch", 42), ("http", 1500), ("lambda", 1500)]);
    }

    #[test]
    fn every_output_schema_is_a_json_schema() {
        for executor in each() {
            let schema = executor.output_schema();
            JsonSchema::compile(&schema).unwrap_or_else(|e| panic!("{}: {e}", executor.name()));
        }
    }

    #[test]
    fn log_lines_are_held_and_only_counting_progress_is_shown() {
        let log = Report::Log { line: format!("upload x: sha256 {}", "ab".repeat(32)) };
        for executor in each() {
            assert!(!executor.discloses(&log), "{}: a log line bears on the result", executor.name());
        }
        let hashed = Report::Progress { fraction: 0.5, detail: json!({ "bytes": 1024, "total": 2048 }) };
        let digest = &each()[0];
        assert!(digest.discloses(&hashed), "how much of the upload is hashed is not the result");
        assert!(super::super::discloses(digest, &hashed));
    }

    /// An executor that says nothing about its reports.
    struct Silent;

    impl ExecutorKind for Silent {
        const NAME: &'static str = "silent";
        fn configure(_: &Fields<'_>, _: &mut Problems) -> Option<Self> {
            Some(Silent)
        }
        fn measures(&self) -> Quantity {
            Quantity::Bytes
        }
        fn used(&self, _: &Value, _: Duration) -> u64 {
            0
        }
        fn output_schema(&self) -> Value {
            json!({})
        }
    }

    #[test]
    fn an_executor_that_does_not_say_holds_every_report() {
        let reports = [
            Report::Progress { fraction: 0.0, detail: json!({}) },
            Report::Progress { fraction: 1.0, detail: json!({ "bytes": 1 }) },
            Report::Log { line: "done".into() },
        ];
        for report in &reports {
            assert!(!Silent.discloses(report), "{report:?} is held by default");
        }
    }
}
