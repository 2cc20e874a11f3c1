//! The template's monitoring block: every alarm an operator is promised
//! exists and notifies the SNS topic parameter, the dashboard body is valid
//! JSON, and every metric of Reeve's that they read is one the code records
//! (a renamed metric would otherwise leave an alarm silently without data).

use std::collections::BTreeSet;
use std::path::Path;

use reeve_shared::metrics;
use serde_json::Value;

fn template() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../template.yaml")).unwrap()
}

/// The body of the top-level resource `name`: its indented lines.
fn resource(text: &str, name: &str) -> String {
    let start = text.find(&format!("\n  {name}:\n")).unwrap_or_else(|| panic!("no resource {name}"));
    let body = &text[start + name.len() + 5..];
    body.lines().take_while(|l| l.is_empty() || l.starts_with("    ")).collect::<Vec<_>>().join("\n")
}

const ALARMS: &[(&str, &str)] = &[
    ("DeadLetterQueueAlarm", "ApproximateNumberOfMessagesVisible"),
    ("QueueAgeAlarm", "ApproximateAgeOfOldestMessage"),
    ("WorkerErrorsAlarm", "Errors"),
    ("FunctionErrorsAlarm", "Errors"),
    ("RelayUnhealthyHostsAlarm", "UnHealthyHostCount"),
    ("Relay5xxAlarm", "HTTPCode_Target_5XX_Count"),
    ("FailedTaskRateAlarm", metrics::TASKS_FINISHED),
    ("BatchClaimsFailingAlarm", metrics::SWEEPER_ACTIONS),
    ("BatchClaimDeadlineAlarm", metrics::SWEEPER_ACTIONS),
];

#[test]
fn every_alarm_exists_and_notifies_the_topic_parameter() {
    let text = template();
    assert!(text.contains("\n  AlarmTopicArn:\n    Type: String"), "the SNS topic is a parameter");
    for (name, metric) in ALARMS {
        let body = resource(&text, name);
        assert!(body.contains("Type: AWS::CloudWatch::Alarm"), "{name}:\n{body}");
        assert!(body.contains(metric), "{name} reads {metric}:\n{body}");
        for key in ["AlarmActions", "OKActions"] {
            assert!(
                body.contains(&format!("{key}: !If [HasAlarmTopic, [!Ref AlarmTopicArn], !Ref AWS::NoValue]")),
                "{name} {key}"
            );
        }
    }
    // The DLQ alarm fires on the first dead letter.
    let dlq = resource(&text, "DeadLetterQueueAlarm");
    assert!(dlq.contains("Value: !GetAtt TaskDeadLetterQueue.QueueName"));
    assert!(dlq.contains("Threshold: 0\n") && dlq.contains("ComparisonOperator: GreaterThanThreshold"));
    // Every function but the worker (which has alarms of its own) is in the
    // function-errors sum, and in its expression: a function added later
    // is counted without editing this list.
    let functions = resource(&text, "FunctionErrorsAlarm");
    let lambdas = serverless_functions(&text);
    assert!(lambdas.len() >= 9, "{lambdas:?}");
    // The example service (WordfreqFunction, deployed only on request) is
    // the operator's work sold through Reeve, not one of Reeve's functions.
    for f in lambdas.iter().filter(|f| *f != "WorkerFunction" && *f != "WordfreqFunction") {
        assert!(functions.contains(&format!("Value: !Ref {f}")), "{f} is not in FunctionErrorsAlarm");
    }
    let ids = functions.matches("MetricStat:").count();
    let summed =
        functions.split("Expression: SUM([").nth(1).and_then(|rest| rest.split("])").next()).unwrap_or_default();
    assert_eq!(summed.split(',').count(), ids, "every metric of FunctionErrorsAlarm is summed: {summed}");
}

/// The logical id of every `AWS::Serverless::Function` in the template.
fn serverless_functions(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    lines
        .windows(2)
        .filter(|w| {
            w[1].trim() == "Type: AWS::Serverless::Function" && w[0].starts_with("  ") && !w[0].starts_with("   ")
        })
        .map(|w| w[0].trim().trim_end_matches(':').to_owned())
        .collect()
}

/// Every `reeve_*` name in `text`.
fn reeve_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("reeve_") {
        let tail = &rest[i..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        names.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

#[test]
fn the_dashboard_is_json_and_reads_only_metrics_the_code_records() {
    let text = template();
    let dashboard = resource(&text, "Dashboard");
    let start = dashboard.find("- |\n").expect("the body is a literal block") + 4;
    let end = dashboard.find("\n        - Queue:").expect("the Sub variables follow");
    // What CloudFormation's !Sub would do, with stand-in values.
    let mut body = String::new();
    let mut rest = &dashboard[start..end];
    while let Some(i) = rest.find("${") {
        body.push_str(&rest[..i]);
        let close = rest[i..].find('}').unwrap();
        body.push('x');
        rest = &rest[i + close + 1..];
    }
    body.push_str(rest);
    let json: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}:\n{body}"));
    assert!(json["widgets"].as_array().unwrap().len() >= 6);

    let known: BTreeSet<String> = [
        metrics::HTTP_REQUESTS,
        metrics::TASKS_FINISHED,
        metrics::TASKS_FAILED,
        metrics::TASK_RUN,
        metrics::QUEUE_WAIT,
        metrics::PAYMENTS_SETTLED,
        metrics::PAYMENTS_FAILED,
        metrics::CREDITS_ISSUED,
        metrics::CREDITS_SPENT,
        metrics::SWEEPER_ACTIONS,
    ]
    .into_iter()
    .map(String::from)
    .collect();
    let used = reeve_names(&format!("{body}\n{}", resource(&text, "FailedTaskRateAlarm")));
    assert!(!used.is_empty());
    for name in &used {
        assert!(known.contains(name), "{name} is read by the template but is not a metric the code records");
    }
}

/// The namespace every Lambda writes its EMF lines to, as the template sets
/// it: `!Sub Reeve/${Stage}` in the functions' globals.
fn emf_namespace(text: &str) -> String {
    let name = reeve_shared::settings::METRICS_NAMESPACE;
    let line = text
        .lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{name}: ")))
        .unwrap_or_else(|| panic!("the functions' globals set no {name}"));
    line.strip_prefix("!Sub ").unwrap_or_else(|| panic!("{name} is per stage, a !Sub of Stage: {line}")).to_owned()
}

#[test]
fn the_emf_namespace_is_per_stage_and_the_alarms_and_dashboard_read_it() {
    let text = template();
    let namespace = emf_namespace(&text);
    assert!(namespace.contains("${Stage}"), "{namespace}: two stages in one account must not share a namespace");
    assert_ne!(namespace, metrics::DEFAULT_NAMESPACE);
    let globals = &text[text.find("\nGlobals:\n").unwrap()..text.find("\nResources:\n").unwrap()];
    assert!(globals.contains(&format!("{}: !Sub {namespace}\n", reeve_shared::settings::METRICS_NAMESPACE)));

    // Every alarm metric outside AWS's own namespaces is in this one.
    let monitoring = &text[text.find("\n  DeadLetterQueueAlarm:\n").unwrap()..text.find("\n  Dashboard:\n").unwrap()];
    let mut reeve_alarm_metrics = 0;
    for part in monitoring.split("Namespace: ").skip(1) {
        let value = part.split([',', '\n']).next().unwrap().trim();
        if value.starts_with("AWS/") {
            continue;
        }
        assert_eq!(value, format!("!Sub \"{namespace}\""), "an alarm reads another namespace");
        reeve_alarm_metrics += 1;
    }
    assert_eq!(
        reeve_alarm_metrics, 5,
        "the failed-task rate reads failed and completed, the batch claims alarm the sweeper's claim_failed, \
         the batch deadline alarm its claim_at_risk and claim_shortfall"
    );

    // The dashboard, each metric and each SEARCH: the same namespace, and
    // never the unstaged default.
    let dashboard = resource(&text, "Dashboard");
    let body = &dashboard[dashboard.find("- |\n").unwrap()..dashboard.find("\n        - Queue:").unwrap()];
    let mut reeve_rows = 0;
    for row in body.split("[\"").skip(1) {
        let first = row.split('"').next().unwrap();
        if !first.starts_with("AWS/") {
            assert_eq!(first, namespace, "a dashboard row reads another namespace: [\"{row}");
            reeve_rows += 1;
        }
    }
    let searches: Vec<&str> = body.split("SEARCH('{").skip(1).collect();
    for search in &searches {
        let schema_namespace = search.split(',').next().unwrap();
        assert_eq!(schema_namespace, format!("\\\"{namespace}\\\""), "SEARCH('{{{search}");
    }
    assert!(reeve_rows >= 3 && searches.len() >= 8, "{reeve_rows} rows, {} searches", searches.len());
    assert!(!body.contains(&format!("\"{}\"", metrics::DEFAULT_NAMESPACE)), "the unstaged namespace is read");
}

#[test]
fn the_relay_metrics_port_is_for_the_scraper_never_the_load_balancer() {
    let text = template();
    let port = reeve_shared::startup::DEFAULT_RELAY_METRICS_BIND.port();
    let task = resource(&text, "RelayTaskDefinition");
    assert!(task.contains(&format!("- ContainerPort: {port}\n")), "the container maps {port}:\n{task}");
    assert!(
        task.contains(&format!("- Name: REEVE_METRICS_BIND\n              Value: 0.0.0.0:{port}\n")),
        "the relay listens for the scraper beyond loopback:\n{task}"
    );
    // The load balancer reaches 8080 alone: its target group, the service's
    // registration and the tasks' security group name no other port.
    assert!(resource(&text, "RelayTargetGroup").contains("Port: 8080\n"));
    let service = resource(&text, "RelayService");
    assert!(service.contains("ContainerPort: 8080") && !service.contains(&port.to_string()), "{service}");
    let group = resource(&text, "RelaySecurityGroup");
    assert!(!group.contains(&port.to_string()), "the load balancer's rule must not open {port}:\n{group}");
    // The scraper's rule exists only when the operator names its addresses.
    assert!(text.contains("\n  MetricsScrapeCidr:\n    Type: String\n    Default: \"\"\n"));
    assert!(text.contains("\n  HasMetricsScraper: !Not [!Equals [!Ref MetricsScrapeCidr, \"\"]]\n"));
    let rule = resource(&text, "RelayMetricsScrapeIngress");
    for line in [
        "Type: AWS::EC2::SecurityGroupIngress",
        "Condition: HasMetricsScraper",
        "GroupId: !GetAtt RelaySecurityGroup.GroupId",
        &format!("FromPort: {port}"),
        &format!("ToPort: {port}"),
        "CidrIp: !Ref MetricsScrapeCidr",
    ] {
        assert!(rule.contains(line), "{line}:\n{rule}");
    }
    assert!(!rule.contains("SourceSecurityGroupId"), "never the load balancer:\n{rule}");
    // The image says the same as the task definition.
    let dockerfile =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../functions/relay/Dockerfile")).unwrap();
    assert!(dockerfile.contains(&format!("REEVE_METRICS_BIND=0.0.0.0:{port}")), "{dockerfile}");
    assert!(dockerfile.contains(&format!("EXPOSE 8080 {port}")), "{dockerfile}");
}
