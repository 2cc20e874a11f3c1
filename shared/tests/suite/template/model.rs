//! `template.yaml` as data: parsed as YAML, CloudFormation's short tags
//! (`!Ref`, `!GetAtt`, `!If`, …) turned into their long JSON forms, so the
//! rules that span resources read like the template's own reference.
//!
//! [`Template::resolve`] takes the template's conditions one way, for a given
//! set of parameter values, and removes the branches not taken, as
//! CloudFormation does at deploy time: the VPC variant is the same template
//! with two parameters set.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value, json};

pub struct Template {
    pub doc: Value,
}

/// What SAM gives a function that sets no `Timeout` (nor does `Globals`).
const SAM_DEFAULT_TIMEOUT: u64 = 3;
/// What SQS gives a queue that sets no `VisibilityTimeout`.
pub const SQS_DEFAULT_VISIBILITY: u64 = 30;
/// What SQS gives a queue that sets no `MessageRetentionPeriod` (4 days).
pub const SQS_DEFAULT_RETENTION: u64 = 345_600;

impl Template {
    pub fn load() -> Template {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../template.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        let yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("template.yaml is YAML");
        Template { doc: to_json(yaml) }
    }

    pub fn resources(&self) -> &Map<String, Value> {
        self.doc["Resources"].as_object().expect("Resources")
    }

    pub fn resource(&self, name: &str) -> &Value {
        self.resources().get(name).unwrap_or_else(|| panic!("no resource {name}"))
    }

    /// Resources of one type, by logical id.
    pub fn of_type<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = (&'a str, &'a Value)> + 'a {
        self.resources().iter().filter(move |(_, r)| r["Type"] == kind).map(|(n, r)| (n.as_str(), r))
    }

    /// Each of Reeve's own SAM functions' properties, with
    /// `Globals.Function` under them (a function's own value wins, as SAM
    /// merges scalars). A function only a condition deploys (the example,
    /// `DeployWordfreqExample`) is not Reeve's: the template tests check it
    /// on its own.
    pub fn functions(&self) -> BTreeMap<&str, Map<String, Value>> {
        let globals = self.doc["Globals"]["Function"].as_object().cloned().unwrap_or_default();
        self.of_type("AWS::Serverless::Function")
            .filter(|(_, r)| r.get("Condition").is_none())
            .map(|(name, r)| {
                let mut props = globals.clone();
                for (k, v) in r["Properties"].as_object().cloned().unwrap_or_default() {
                    props.insert(k, v);
                }
                (name, props)
            })
            .collect()
    }

    pub fn function_timeout(props: &Map<String, Value>) -> u64 {
        props.get("Timeout").map_or(SAM_DEFAULT_TIMEOUT, |t| number(t).expect("a literal Timeout"))
    }

    /// The template with its conditions evaluated for `parameters` (the
    /// others at their defaults) and every branch not taken removed.
    pub fn resolve(&self, parameters: &[(&str, &str)]) -> Value {
        let values = self.parameter_values(parameters);
        let conditions = self.doc["Conditions"].as_object().cloned().unwrap_or_default();
        let mut evaluated = BTreeMap::new();
        for name in conditions.keys() {
            let v = condition(name, &conditions, &values, &mut evaluated);
            evaluated.insert(name.clone(), v);
        }
        let mut doc = self.doc.clone();
        let resources = doc["Resources"].as_object_mut().unwrap();
        resources.retain(|_, r| r.get("Condition").and_then(Value::as_str).is_none_or(|c| evaluated[c]));
        prune(&mut doc, &evaluated);
        doc
    }
}

impl Template {
    /// The `AssertDescription` of every rule assertion that fails for
    /// `parameters` (the others at their defaults): what CloudFormation
    /// answers before it makes anything. `Fn::Not`, `Fn::Equals` and
    /// `Fn::Contains` on parameters are modelled, as the rules use them.
    pub fn rule_failures(&self, parameters: &[(&str, &str)]) -> Vec<String> {
        let values = self.parameter_values(parameters);
        let mut failures = Vec::new();
        for rule in self.doc["Rules"].as_object().into_iter().flat_map(|r| r.values()) {
            if let Some(condition) = rule.get("RuleCondition")
                && !eval_rule(condition, &values)
            {
                continue;
            }
            for assertion in rule["Assertions"].as_array().unwrap() {
                if !eval_rule(&assertion["Assert"], &values) {
                    failures.push(assertion["AssertDescription"].as_str().unwrap_or_default().trim().to_owned());
                }
            }
        }
        failures
    }

    fn parameter_values(&self, parameters: &[(&str, &str)]) -> BTreeMap<String, Value> {
        let mut values: BTreeMap<String, Value> = BTreeMap::new();
        for (name, p) in self.doc["Parameters"].as_object().unwrap() {
            if let Some(default) = p.get("Default") {
                values.insert(name.clone(), parameter_value(p, default));
            }
        }
        for (name, value) in parameters {
            let p = &self.doc["Parameters"][*name];
            assert!(p.is_object(), "no parameter {name}");
            values.insert((*name).to_owned(), parameter_value(p, &json!(value)));
        }
        values.insert("AWS::Region".into(), json!("us-east-1"));
        values
    }
}

/// A rule's condition or assertion, for parameter values.
fn eval_rule(expr: &Value, values: &BTreeMap<String, Value>) -> bool {
    let (op, args) = single(expr).unwrap_or_else(|| panic!("not a rule function: {expr}"));
    match op {
        "Fn::Not" => !eval_rule(&args[0], values),
        "Fn::And" => args.as_array().unwrap().iter().all(|a| eval_rule(a, values)),
        "Fn::Or" => args.as_array().unwrap().iter().any(|a| eval_rule(a, values)),
        "Fn::Equals" => scalar_text(&eval_value(&args[0], values)) == scalar_text(&eval_value(&args[1], values)),
        // A list parameter contains a value.
        "Fn::Contains" => {
            let list = eval_value(&args[0], values);
            let wanted = scalar_text(&eval_value(&args[1], values));
            match list.as_array() {
                Some(items) => {
                    items.iter().any(|i| scalar_text(i) == wanted) || (items.is_empty() && wanted.is_empty())
                }
                None => scalar_text(&list) == wanted,
            }
        }
        other => panic!("rule function {other} is not modelled here"),
    }
}

/// A parameter's value as `Ref` yields it: a list for list types.
fn parameter_value(parameter: &Value, value: &Value) -> Value {
    let is_list = parameter["Type"].as_str().is_some_and(|t| t.starts_with("List<") || t == "CommaDelimitedList");
    match value.as_str() {
        Some(text) if is_list => {
            Value::Array(text.split(',').filter(|s| !s.is_empty()).map(|s| json!(s.trim())).collect())
        }
        _ => value.clone(),
    }
}

fn condition(
    name: &str,
    all: &Map<String, Value>,
    values: &BTreeMap<String, Value>,
    done: &mut BTreeMap<String, bool>,
) -> bool {
    if let Some(v) = done.get(name) {
        return *v;
    }
    let v = eval_bool(&all[name], all, values, done);
    done.insert(name.to_owned(), v);
    v
}

fn eval_bool(
    expr: &Value,
    all: &Map<String, Value>,
    values: &BTreeMap<String, Value>,
    done: &mut BTreeMap<String, bool>,
) -> bool {
    let (op, args) = single(expr).unwrap_or_else(|| panic!("not a condition: {expr}"));
    match op {
        "Condition" => condition(args.as_str().unwrap(), all, values, done),
        "Fn::Not" => !eval_bool(&args[0], all, values, done),
        "Fn::And" => args.as_array().unwrap().iter().all(|a| eval_bool(a, all, values, done)),
        "Fn::Or" => args.as_array().unwrap().iter().any(|a| eval_bool(a, all, values, done)),
        // CloudFormation compares as strings: a Number parameter's 0 equals "0".
        "Fn::Equals" => scalar_text(&eval_value(&args[0], values)) == scalar_text(&eval_value(&args[1], values)),
        other => panic!("condition function {other} is not modelled here"),
    }
}

fn eval_value(expr: &Value, values: &BTreeMap<String, Value>) -> Value {
    match single(expr) {
        Some(("Ref", name)) => {
            values.get(name.as_str().unwrap()).cloned().unwrap_or_else(|| panic!("no value for {name}"))
        }
        Some(("Fn::Join", args)) => {
            let list = eval_value(&args[1], values);
            let parts: Vec<String> = list.as_array().unwrap().iter().map(scalar_text).collect();
            json!(parts.join(args[0].as_str().unwrap()))
        }
        _ => json!(scalar_text(expr)),
    }
}

fn scalar_text(v: &Value) -> String {
    v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string())
}

/// `Fn::If` replaced by its branch; `Ref AWS::NoValue` removed from the
/// maps and lists that hold it.
fn prune(value: &mut Value, conditions: &BTreeMap<String, bool>) {
    if let Some(("Fn::If", args)) = single(value) {
        let taken = if conditions[args[0].as_str().unwrap()] { args[1].clone() } else { args[2].clone() };
        *value = taken;
        return prune(value, conditions);
    }
    match value {
        Value::Object(map) => {
            for v in map.values_mut() {
                prune(v, conditions);
            }
            map.retain(|_, v| !is_no_value(v));
        }
        Value::Array(items) => {
            for v in items.iter_mut() {
                prune(v, conditions);
            }
            items.retain(|v| !is_no_value(v));
        }
        _ => {}
    }
}

fn is_no_value(v: &Value) -> bool {
    matches!(single(v), Some(("Ref", name)) if name == "AWS::NoValue")
}

/// `{"Fn::X": args}` → `("Fn::X", args)`: an intrinsic function, or `Ref`.
pub fn single(v: &Value) -> Option<(&str, &Value)> {
    let map = v.as_object()?;
    if map.len() != 1 {
        return None;
    }
    let (k, v) = map.iter().next()?;
    (k == "Ref" || k == "Condition" || k.starts_with("Fn::")).then_some((k.as_str(), v))
}

/// The logical id a `!GetAtt X.Arn` or `!Ref X` names.
pub fn target(v: &Value) -> Option<&str> {
    match single(v)? {
        ("Ref", name) => name.as_str(),
        ("Fn::GetAtt", args) => args[0].as_str(),
        _ => None,
    }
}

/// A literal number (YAML may quote it).
pub fn number(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| v.as_str()?.parse().ok())
}

fn to_json(v: serde_yaml_ng::Value) -> Value {
    use serde_yaml_ng::Value as Y;
    match v {
        Y::Null => Value::Null,
        Y::Bool(b) => Value::Bool(b),
        Y::Number(n) => serde_json::to_value(n).unwrap(),
        Y::String(s) => Value::String(s),
        Y::Sequence(items) => Value::Array(items.into_iter().map(to_json).collect()),
        Y::Mapping(map) => Value::Object(
            map.into_iter().map(|(k, v)| (k.as_str().expect("string keys").to_owned(), to_json(v))).collect(),
        ),
        Y::Tagged(tagged) => {
            let tag = tagged.tag.to_string();
            let tag = tag.trim_start_matches('!');
            let value = to_json(tagged.value);
            match (tag, value) {
                ("Ref" | "Condition", v) => json!({ tag: v }),
                ("GetAtt", Value::String(path)) => {
                    let (resource, attribute) = path.split_once('.').expect("GetAtt Resource.Attribute");
                    json!({ "Fn::GetAtt": [resource, attribute] })
                }
                (other, v) => json!({ format!("Fn::{other}"): v }),
            }
        }
    }
}
