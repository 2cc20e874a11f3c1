//! The template's routes are the routers' routes. `template.yaml` lists
//! every API route a second time, as an `HttpApi` event of the function that
//! serves it; a route added to a router and not to the template works under
//! `reeve serve` and is missing in AWS. Each function's `main` names the
//! app it runs (`http::auth_app`, `mcp::router`), and
//! [`reeve_shared::http::lambda_routes`] lists that app's routes (and
//! `mcp::PATH` the MCP endpoint's).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::model::Template;

type Routes = BTreeSet<(String, String)>;

/// Every app a function may run, with its routes.
fn apps() -> BTreeMap<&'static str, Routes> {
    let mut apps: BTreeMap<&str, Routes> = reeve_shared::http::lambda_routes()
        .into_iter()
        .map(|(app, routes)| (app, routes.into_iter().collect()))
        .collect();
    apps.insert("mcp::router", [("POST".to_owned(), reeve_shared::mcp::PATH.to_owned())].into());
    apps
}

/// Each template function's `HttpApi` events: logical id → routes.
fn template_routes() -> BTreeMap<String, Routes> {
    let template = Template::load();
    template
        .functions()
        .into_iter()
        .map(|(name, props)| {
            let events = props.get("Events").and_then(Value::as_object).cloned().unwrap_or_default();
            let routes = events
                .values()
                .filter(|e| e["Type"] == "HttpApi")
                .map(|e| {
                    let p = &e["Properties"];
                    let method = p["Method"].as_str().expect("a literal Method").to_uppercase();
                    (method, p["Path"].as_str().expect("a literal Path").to_owned())
                })
                .collect();
            (name.to_owned(), routes)
        })
        .collect()
}

/// The app a function's `main` runs, as `lambda_routes` names it: the
/// `http::…_app(` or `mcp::router(` it calls.
fn app_of(binary: &str, apps: &BTreeMap<&str, Routes>) -> Option<String> {
    let main = super::read(&format!("functions/{binary}/src/main.rs"));
    let called: Vec<&&str> = apps.keys().filter(|app| main.contains(&format!("{app}("))).collect();
    assert!(called.len() <= 1, "functions/{binary} runs more than one app: {called:?}");
    called.first().map(|a| (**a).to_owned())
}

#[test]
fn every_router_route_has_its_template_event_with_the_right_function_and_back() {
    let apps = apps();
    let template = template_routes();
    let binaries = super::template_functions();
    let mut served = BTreeSet::new();
    for (function, routes) in &template {
        let binary = &binaries[function];
        let want = match app_of(binary, &apps) {
            Some(app) => {
                assert!(served.insert(app.clone()), "{app} is run by two functions");
                apps[app.as_str()].clone()
            }
            None => Routes::new(),
        };
        let missing: Vec<_> = want.difference(routes).collect();
        let extra: Vec<_> = routes.difference(&want).collect();
        assert!(
            missing.is_empty(),
            "{function} ({binary}) serves these routes, but template.yaml routes none of them to it: {missing:?}"
        );
        assert!(
            extra.is_empty(),
            "template.yaml routes these to {function} ({binary}), which has no handler for them: {extra:?}"
        );
    }
    let unserved: Vec<_> = apps.keys().filter(|app| !served.contains(**app)).collect();
    assert!(unserved.is_empty(), "no template function runs {unserved:?}");
}

#[test]
fn a_route_is_routed_to_one_function_only() {
    let mut seen: BTreeMap<(String, String), String> = BTreeMap::new();
    for (function, routes) in template_routes() {
        for route in routes {
            if let Some(other) = seen.insert(route.clone(), function.clone()) {
                panic!("{route:?} is routed to both {other} and {function}");
            }
        }
    }
}

/// The routes this check was written for are in the table it walks, so a
/// table that lost a router would not pass by being empty.
#[test]
fn the_route_table_covers_the_routes_of_issue_39() {
    let all: Routes = apps().into_values().flatten().collect();
    for (method, path) in [
        ("POST", "/v1/sessions"),
        ("POST", "/v1/spaces"),
        ("GET", "/v1/tasks/{task}"),
        ("POST", "/mcp"),
        ("DELETE", "/v1/sessions/current"),
        ("POST", "/v1/tasks/{task}/ticket"),
        ("POST", "/v1/space/rotate"),
    ] {
        assert!(all.contains(&(method.to_owned(), path.to_owned())), "{method} {path} is in no router");
    }
}
