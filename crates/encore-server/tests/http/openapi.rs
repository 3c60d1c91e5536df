//! `/openapi.json`: it lists every route the server serves (and no other), and the
//! server's answers fit it: real responses of every route, then bodies generated from
//! each POST route's request schema and as many made invalid, and every route of a
//! server with an API key asked without it (scripts/openapi_check.py, with `jsonschema`,
//! as vLLM's schemathesis run): no 5xx, every answer documented and valid against its
//! schema. The script needs the python of `scripts/ci-venv.sh`
//! (`ENCORE_OPENAI_PYTHON`); without it the test says so and passes, unless
//! `ENCORE_REQUIRE_OPENAI=1` (CI).

use std::path::PathBuf;
use std::process::Command;

use serde_json::{json, Value};

use crate::harness::*;

/// Every route of the server, with its method.
const ROUTES: [(&str, &str); 12] = [
    ("post", "/v1/completions"),
    ("post", "/v1/chat/completions"),
    ("post", "/v1/responses"),
    ("post", "/v1/messages"),
    ("post", "/v1/messages/count_tokens"),
    ("post", "/tokenize"),
    ("post", "/detokenize"),
    ("get", "/v1/models"),
    ("get", "/v1/models/{model}"),
    ("get", "/health"),
    ("get", "/metrics"),
    ("get", "/openapi.json"),
];

fn document(s: &Server) -> Value {
    let (st, body) = http(s.addr, "GET", "/openapi.json", None, &[]);
    assert_eq!(st, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[test]
fn openapi_lists_every_route_and_no_other() {
    let s = start(Some("key"));
    // Served without the API key, as vLLM serves it.
    let doc = document(&s);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"), "{doc}");
    let paths = doc["paths"].as_object().unwrap();
    for (method, path) in ROUTES {
        let op = &paths[path][method];
        assert!(op.is_object(), "{method} {path} missing from /openapi.json");
        assert!(op["responses"]["200"].is_object(), "{method} {path}");
        if method == "post" {
            let schema = &op["requestBody"]["content"]["application/json"]["schema"]["$ref"];
            let name = schema.as_str().unwrap().rsplit('/').next().unwrap();
            assert!(
                doc["components"]["schemas"][name]["properties"].is_object(),
                "{path}"
            );
        }
    }
    let listed: usize = paths.values().map(|p| p.as_object().unwrap().len()).sum();
    assert_eq!(
        listed,
        ROUTES.len(),
        "{:?}",
        paths.keys().collect::<Vec<_>>()
    );
    // Each documented route is served (an unknown path would be a 404 "no such endpoint").
    for (method, path) in ROUTES {
        let path = path.replace("{model}", MODEL);
        let body = (method == "post").then_some("{}");
        let (st, text) = http(s.addr, &method.to_uppercase(), &path, body, &[]);
        assert!(
            !text.contains("no such endpoint"),
            "{method} {path}: {st} {text}"
        );
    }
}

#[test]
fn answers_fit_the_openapi_document() {
    let Some(python) = python_with("jsonschema") else {
        return;
    };
    let s = start(None);
    let keyed = start(Some("key"));
    let dir = std::env::temp_dir().join(format!("encore-openapi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("case.json");
    let case = json!({
        "base_url": format!("http://{}", s.addr), "keyed_url": format!("http://{}", keyed.addr),
        "model": MODEL, "seed": 45, "cases": 25,
    });
    std::fs::write(&cfg, case.to_string()).unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/openapi_check.py");
    let out = Command::new(python).arg(script).arg(&cfg).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", String::from_utf8_lossy(&out.stdout).trim());
}

/// The python to run the check with, with the `modules` (`import` syntax), or `None`
/// (skip) when there is none and it is not required.
fn python_with(modules: &str) -> Option<PathBuf> {
    let required = std::env::var("ENCORE_REQUIRE_OPENAI").as_deref() == Ok("1");
    let py = std::env::var_os("ENCORE_OPENAI_PYTHON").map(PathBuf::from);
    let usable = py.as_ref().is_some_and(|p| {
        Command::new(p)
            .args(["-c", &format!("import {modules}")])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if usable {
        return py;
    }
    assert!(
        !required,
        "ENCORE_REQUIRE_OPENAI=1 but ENCORE_OPENAI_PYTHON ({py:?}) is not a python with {modules}"
    );
    eprintln!(
        "skipped: set ENCORE_OPENAI_PYTHON to a python with {modules} \
         (scripts/ci-venv.sh makes one)"
    );
    None
}
