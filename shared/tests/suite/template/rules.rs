//! Rules that span resources, read from the template as data ([`Template`]).
//! Most are ones AWS applies when the stack is deployed, not when it is
//! linted: `sam validate --lint` passes templates that CloudFormation then
//! refuses, and neither LocalStack nor moto refuses them either. The rest
//! keep the stack fit to run: nothing stored for ever, a VPC when asked.

use std::path::Path;

use serde_json::Value;

use super::model::{SQS_DEFAULT_RETENTION, SQS_DEFAULT_VISIBILITY, Template, number, target};

/// API Gateway ends an integration after 30 s, whatever the function's own
/// timeout: a longer one keeps running (and billing) for a client that has
/// been answered 503.
const API_GATEWAY_TIMEOUT: u64 = 30;

fn events(props: &serde_json::Map<String, Value>) -> Vec<(&str, &Value)> {
    props
        .get("Events")
        .and_then(Value::as_object)
        .map(|e| e.iter().map(|(n, v)| (n.as_str(), v)).collect())
        .unwrap_or_default()
}

/// AWS refuses an SQS event source mapping whose queue's visibility timeout
/// is shorter than the function's timeout (cfn-lint's E3505 on the
/// translated template; scripts/sam-check.sh runs it too). The dead-letter
/// queue, consumed by the sweeper, kept SQS's default of 30 s against the
/// sweeper's 60.
#[test]
fn every_sqs_event_source_s_queue_outlasts_its_function() {
    let t = Template::load();
    let mut seen = 0;
    for (name, props) in t.functions() {
        let timeout = Template::function_timeout(&props);
        for (event, e) in events(&props) {
            if e["Type"] != "SQS" {
                continue;
            }
            seen += 1;
            let queue = target(&e["Properties"]["Queue"]).unwrap_or_else(|| panic!("{name}.{event}: Queue"));
            let q = t.resource(queue);
            assert_eq!(q["Type"], "AWS::SQS::Queue", "{name}.{event} reads {queue}");
            let visibility = q["Properties"].get("VisibilityTimeout").map_or(SQS_DEFAULT_VISIBILITY, |v| {
                number(v).unwrap_or_else(|| panic!("{queue}: a literal VisibilityTimeout"))
            });
            assert!(
                visibility >= timeout,
                "{queue}'s VisibilityTimeout ({visibility} s) is less than {name}'s Timeout ({timeout} s): \
                 AWS refuses the event source mapping {name}.{event}"
            );
        }
    }
    assert!(seen >= 2, "the worker and the sweeper's dead letters are SQS event sources");
}

#[test]
fn every_http_function_fits_api_gateway_s_30_seconds() {
    let t = Template::load();
    let mut seen = 0;
    for (name, props) in t.functions() {
        if !events(&props).iter().any(|(_, e)| e["Type"] == "HttpApi" || e["Type"] == "Api") {
            continue;
        }
        seen += 1;
        let timeout = Template::function_timeout(&props);
        assert!(
            timeout <= API_GATEWAY_TIMEOUT,
            "{name} has Timeout {timeout} s, but API Gateway answers its clients 503 after {API_GATEWAY_TIMEOUT} s"
        );
    }
    assert!(seen >= 5, "auth, catalog, presign, task-create and task-status serve the HTTP API");
}

/// A message keeps its first enqueue time when SQS dead-letters it, so a
/// dead-letter queue that keeps messages no longer than its source deletes
/// them as they arrive.
#[test]
fn every_dead_letter_queue_keeps_messages_longer_than_its_source() {
    let t = Template::load();
    let retention =
        |q: &Value| q["Properties"].get("MessageRetentionPeriod").map_or(SQS_DEFAULT_RETENTION, |v| number(v).unwrap());
    let mut seen = 0;
    for (name, q) in t.of_type("AWS::SQS::Queue") {
        let Some(redrive) = q["Properties"].get("RedrivePolicy") else { continue };
        seen += 1;
        let dlq = target(&redrive["deadLetterTargetArn"]).unwrap_or_else(|| panic!("{name}: deadLetterTargetArn"));
        let (source, kept) = (retention(q), retention(t.resource(dlq)));
        assert!(kept > source, "{dlq} keeps messages {kept} s, no longer than its source {name} ({source} s)");
    }
    assert!(seen >= 1, "TaskQueue redrives to TaskDeadLetterQueue");
}

/// The principal that must be able to assume a role, by where it is named.
fn principal_for(property: &str) -> &'static str {
    match property {
        "Role" => "lambda.amazonaws.com",
        "RoleArn" => "scheduler.amazonaws.com",
        "ExecutionRoleArn" | "TaskRoleArn" => "ecs-tasks.amazonaws.com",
        other => panic!("{other} names no role"),
    }
}

/// Does this template role's trust policy let `service` assume it?
fn trusts(role: &Value, service: &str) -> bool {
    role["Properties"]["AssumeRolePolicyDocument"]["Statement"].as_array().is_some_and(|statements| {
        statements.iter().any(|s| {
            let principals = &s["Principal"]["Service"];
            let named = principals == service || principals.as_array().is_some_and(|l| l.iter().any(|p| p == service));
            s["Effect"] == "Allow" && named && (s["Action"] == "sts:AssumeRole")
        })
    })
}

/// A role given by the template must be one its user can assume; a function
/// or schedule that names none gets SAM's own, made for it: the function's
/// trusting `lambda.amazonaws.com`, the schedule's `scheduler.amazonaws.com`.
/// An ARN from elsewhere (a parameter) is refused here: its trust cannot be
/// checked before the deploy fails on it.
#[test]
fn every_function_a_queue_or_schedule_invokes_has_a_role_it_can_assume() {
    let t = Template::load();
    let check = |owner: &str, property: &str, value: &Value| {
        let role = target(value).unwrap_or_else(|| panic!("{owner}.{property} is not a role of this template"));
        let r = t.resource(role);
        assert_eq!(r["Type"], "AWS::IAM::Role", "{owner}.{property} names {role}");
        let service = principal_for(property);
        assert!(trusts(r, service), "{owner}.{property}: {service} may not assume {role}");
    };
    let mut invoked = 0;
    for (name, props) in t.functions() {
        let triggers: Vec<(&str, &Value)> = events(&props)
            .into_iter()
            .filter(|(_, e)| ["SQS", "Schedule", "ScheduleV2", "S3"].contains(&e["Type"].as_str().unwrap_or("")))
            .collect();
        if triggers.is_empty() {
            continue;
        }
        invoked += 1;
        match props.get("Role") {
            Some(role) => check(name, "Role", role),
            // SAM's role for the function carries these statements.
            None => assert!(props.contains_key("Policies"), "{name}: SAM makes its role from Policies"),
        }
        for (event, e) in triggers {
            if let Some(role) = e["Properties"].get("RoleArn") {
                check(&format!("{name}.{event}"), "RoleArn", role);
            }
        }
    }
    assert!(invoked >= 3, "the worker, the sweeper and the upload guard are invoked by AWS, not by a client");
    // The relay's roles, which ECS assumes.
    for (name, task) in t.of_type("AWS::ECS::TaskDefinition") {
        for property in ["ExecutionRoleArn", "TaskRoleArn"] {
            if let Some(role) = task["Properties"].get(property) {
                check(name, property, role);
            }
        }
    }
}

#[test]
fn the_model_reads_what_the_template_says() {
    // The rules above only mean something if the model reads the template
    // right: spot-check it against values the text states plainly.
    let t = Template::load();
    let functions = t.functions();
    assert_eq!(Template::function_timeout(&functions["SweeperFunction"]), 60);
    assert_eq!(Template::function_timeout(&functions["AuthFunction"]), 15, "Globals' Timeout");
    assert_eq!(functions["WorkerFunction"]["Runtime"], "provided.al2023", "Globals reach every function");
    let sweeper_dlq = &functions["SweeperFunction"]["Events"]["DeadLetters"]["Properties"]["Queue"];
    assert_eq!(target(sweeper_dlq), Some("TaskDeadLetterQueue"));
    let resolved = t.resolve(&[("ApiLoginRateLimitPerIp", "100")]);
    assert!(resolved["Resources"].get("ApiWebAcl").is_some(), "a condition taken the other way");
    assert!(t.resolve(&[])["Resources"].get("ApiWebAcl").is_none(), "ApiHasWaf is false by default");
}

/// An SQS event source may run `MaximumConcurrency` batches at once; with
/// less reserved concurrency than that, Lambda throttles the rest, and the
/// throttled batches return to the queue and count as receives toward the
/// dead-letter queue.
#[test]
fn every_sqs_event_source_fits_its_function_s_reserved_concurrency() {
    let t = Template::load();
    let mut seen = 0;
    for (name, props) in t.functions() {
        for (event, e) in events(&props) {
            let Some(max) = e["Properties"]["ScalingConfig"].get("MaximumConcurrency") else { continue };
            seen += 1;
            let max = number(max).unwrap();
            let reserved = props.get("ReservedConcurrentExecutions").and_then(number);
            let reserved = reserved.unwrap_or_else(|| panic!("{name}: a literal ReservedConcurrentExecutions"));
            assert!(reserved >= max, "{name} reserves {reserved}, but {name}.{event} may run {max} batches at once");
        }
    }
    assert!(seen >= 2, "the worker's queue and the sweeper's dead letters both cap their concurrency");
}

/// Each function reserves concurrency (checkov's CKV_AWS_115), and every
/// reservation comes out of one account quota of which AWS keeps 100
/// unreserved: `ApiFunctionConcurrency`'s description, and the operations
/// guide, say how large the quota must be, so they must add up.
#[test]
fn the_reserved_concurrency_the_docs_state_is_what_the_stack_reserves() {
    let t = Template::load();
    let (mut per_route, mut fixed) = (0, 0);
    for (name, props) in t.functions() {
        let reserved = props.get("ReservedConcurrentExecutions").unwrap_or_else(|| panic!("{name} reserves nothing"));
        match number(reserved) {
            Some(n) => fixed += n,
            None => {
                assert_eq!(target(reserved), Some("ApiFunctionConcurrency"), "{name}");
                per_route += 1;
            }
        }
    }
    let description = t.doc["Parameters"]["ApiFunctionConcurrency"]["Description"].as_str().unwrap();
    let operations = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operations.md")).unwrap();
    let docs = [
        ("ApiFunctionConcurrency's description", description, "this"),
        ("docs/operations.md", &operations, "`ApiFunctionConcurrency`"),
    ];
    for (doc, text, name) in docs {
        let reserves = format!("{per_route} x {name} + {fixed}");
        let quota = format!("{per_route} x {name} + {}", fixed + 100);
        let text = text.replace('\n', " ").replace("  ", " ");
        assert!(text.contains(&reserves) && text.contains(&quota), "{doc} must say `{reserves}` and `{quota}`");
    }
}

/// The VPC variant: with `FunctionSubnetIds` and `FunctionSecurityGroupIds`
/// set, every function that reaches Postgres (and so Redis: none uses
/// Redis alone) runs in those subnets with those groups; by default none is
/// in a VPC. The catalog, which reaches neither, stays out either way: it
/// would pay for a NAT route it never uses.
#[test]
fn the_functions_that_reach_postgres_or_redis_join_the_vpc_when_it_is_given() {
    let t = Template::load();
    let reaches_the_stores = |props: &serde_json::Map<String, Value>| {
        props["Environment"]["Variables"].get("REEVE_DATABASE_URL_SECRET_ARN").is_some()
    };
    let functions = t.functions();
    let outside: Vec<&str> = functions.iter().filter(|(_, p)| !reaches_the_stores(p)).map(|(n, _)| *n).collect();
    assert_eq!(outside, ["CatalogFunction"], "only the catalog reaches neither Postgres nor Redis");

    let vpc = t.resolve(&[
        ("FunctionSubnetIds", "subnet-0aaaaaaaaaaaaaaaa,subnet-0bbbbbbbbbbbbbbbb"),
        ("FunctionSecurityGroupIds", "sg-0aaaaaaaaaaaaaaaa"),
    ]);
    let public = t.resolve(&[]);
    let expected = serde_json::json!({
        "SubnetIds": { "Ref": "FunctionSubnetIds" },
        "SecurityGroupIds": { "Ref": "FunctionSecurityGroupIds" },
    });
    for (name, props) in &functions {
        let in_vpc = vpc["Resources"][*name]["Properties"].get("VpcConfig");
        let by_default = public["Resources"][*name]["Properties"].get("VpcConfig");
        assert_eq!(by_default, None, "{name} is in a VPC although FunctionSubnetIds is empty");
        if reaches_the_stores(props) {
            assert_eq!(in_vpc, Some(&expected), "{name} reaches Postgres and Redis but is not in the VPC");
        } else {
            assert_eq!(in_vpc, None, "{name} needs no VPC");
        }
    }
    // Both parameters or neither: Lambda refuses a VpcConfig with one.
    let rules = t.doc["Rules"].as_object().unwrap();
    for (subject, needs) in
        [("FunctionSubnetIds", "FunctionSecurityGroupIds"), ("FunctionSecurityGroupIds", "FunctionSubnetIds")]
    {
        let rule = rules.values().find(|r| r["RuleCondition"]["Fn::Not"][0]["Fn::Contains"][0]["Ref"] == subject);
        let rule = rule.unwrap_or_else(|| panic!("no rule for {subject} set alone"));
        assert_eq!(rule["Assertions"][0]["Assert"]["Fn::Not"][0]["Fn::Contains"][0]["Ref"], needs);
    }
}

/// The S3 key prefixes a function may write (`s3:PutObject`), from its
/// policy's resources: `${UploadPrefix}*` as the parameter, else the text.
fn written_prefixes(props: &serde_json::Map<String, Value>) -> Vec<Value> {
    let mut out = Vec::new();
    for policy in props.get("Policies").and_then(Value::as_array).into_iter().flatten() {
        for statement in policy["Statement"].as_array().into_iter().flatten() {
            let actions = &statement["Action"];
            let puts =
                actions == "s3:PutObject" || actions.as_array().is_some_and(|a| a.iter().any(|x| x == "s3:PutObject"));
            if !puts {
                continue;
            }
            let resource = statement["Resource"]["Fn::Sub"].as_str().expect("a bucket ARN with !Sub");
            let (_, key) = resource.split_once("}/").expect("arn:…:s3:::bucket/key");
            let key = key.trim_end_matches('*');
            out.push(match key.strip_prefix("${").and_then(|k| k.strip_suffix('}')) {
                Some(parameter) => serde_json::json!({ "Ref": parameter }),
                None => Value::String(key.to_owned()),
            });
        }
    }
    out
}

/// Nothing Reeve writes is billed for ever: every prefix a function may put
/// objects under has a lifecycle rule that expires them (uploads a day,
/// outputs `OutputRetentionDays`, which the worker is told so its results
/// can say when), and parts of multipart uploads nobody finished are
/// dropped anywhere in the bucket, which the worker may also do itself.
#[test]
fn everything_stored_expires() {
    let t = Template::load();
    let rules = t.resource("UploadBucket")["Properties"]["LifecycleConfiguration"]["Rules"].as_array().unwrap();
    let expiring: Vec<&Value> = rules
        .iter()
        .filter(|r| r["Status"] == "Enabled" && r.get("ExpirationInDays").is_some())
        .map(|r| &r["Prefix"])
        .collect();
    let functions = t.functions();
    let mut written = 0;
    for (name, props) in &functions {
        for prefix in written_prefixes(props) {
            written += 1;
            // A rule's prefix covers every key under it (`outputs/` covers
            // `outputs/*/files/`, the files a service writes).
            let covered = expiring.iter().any(|rule| {
                *rule == &prefix || rule.as_str().zip(prefix.as_str()).is_some_and(|(r, p)| p.starts_with(r))
            });
            assert!(covered, "{name} writes under {prefix}, which no lifecycle rule expires");
        }
    }
    assert!(written >= 2, "presign signs uploads and the worker stores outputs");

    let outputs = rules.iter().find(|r| r["Prefix"] == "outputs/").expect("a rule for outputs/");
    assert_eq!(outputs["ExpirationInDays"]["Ref"], "OutputRetentionDays");
    let worker = &functions["WorkerFunction"];
    assert_eq!(worker["Environment"]["Variables"]["REEVE_OUTPUT_RETENTION_DAYS"]["Ref"], "OutputRetentionDays");
    assert_eq!(t.doc["Parameters"]["OutputRetentionDays"]["Default"], 30);

    let abort = rules.iter().find(|r| r.get("AbortIncompleteMultipartUpload").is_some()).expect("an abort rule");
    assert!(abort.get("Prefix").is_none() && abort.get("Filter").is_none(), "the abort rule covers the whole bucket");
    assert_eq!(abort["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"], 1);
    let aborts =
        worker["Policies"].as_array().unwrap().iter().flat_map(|p| p["Statement"].as_array().unwrap()).any(|s| {
            s["Action"].as_array().is_some_and(|a| a.iter().any(|x| x == "s3:AbortMultipartUpload"))
                && s["Resource"]["Fn::Sub"].as_str().is_some_and(|r| r.ends_with("/outputs/*"))
        });
    assert!(aborts, "the worker may abort its own multipart uploads under outputs/");
}

/// A catalog with prices is refused at start-up without a chain endpoint
/// for each network it prices in; the stack refuses it before anything is
/// made, with a message that names the parameter: `ChainRpcUrls` is
/// required unless `FreeCatalog` says the catalog prices nothing. The
/// shipped catalog prices, so the default asks for it.
#[test]
fn a_priced_catalog_cannot_be_deployed_without_a_chain_endpoint() {
    let t = Template::load();
    let refused = t.rule_failures(&[("RelayCertificateArn", "arn:aws:acm:us-east-1:1:certificate/x")]);
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(refused[0].starts_with("ChainRpcUrls is required"), "{refused:?}");
    assert!(refused[0].contains("FreeCatalog=true"), "it says the way out: {refused:?}");
    let given = t.rule_failures(&[
        ("RelayCertificateArn", "arn:aws:acm:us-east-1:1:certificate/x"),
        ("ChainRpcUrls", "eip155:8453=https://mainnet.base.org"),
    ]);
    assert!(given.is_empty(), "{given:?}");
    let free =
        t.rule_failures(&[("RelayCertificateArn", "arn:aws:acm:us-east-1:1:certificate/x"), ("FreeCatalog", "true")]);
    assert!(free.is_empty(), "{free:?}");

    let layer = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/catalog/reeve.toml");
    let shipped = reeve_shared::catalog::Catalog::load(&layer).expect("the layer's catalog loads");
    assert!(shipped.tasks.values().any(|task| !task.is_free()), "the shipped catalog prices something");
    assert_eq!(t.doc["Parameters"]["FreeCatalog"]["Default"], "false", "so the default asks for an endpoint");
}
