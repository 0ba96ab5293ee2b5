//! Every `--json` output of `runjournal` keeps the one key convention of `runjournal::json`
//! (camelCase, `runId`, moments and spans as `…Ms`), but `status --json`, which is the
//! status.json document of pi-subagents' format.

use serde_json::Value;

use crate::support::{TestHome, run_id_of};

fn json_of(home: &TestHome, args: &[&str]) -> Vec<Value> {
    let output = home.cmd().args(args).output().expect("runjournal runs");
    assert!(output.status.success(), "{args:?}: {output:?}");
    let text = String::from_utf8(output.stdout).expect("UTF-8");
    // One document, or JSON Lines.
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Array(items)) => items,
        Ok(document) => vec![document],
        Err(_) => text
            .lines()
            .map(|line| serde_json::from_str(line).expect("a JSON line"))
            .collect(),
    }
}

#[test]
fn every_json_output_keeps_the_one_key_convention() {
    let home = TestHome::new();
    let launched = json_of(&home, &["run", "--json", "--", "true"]);
    let ended = json_of(
        &home,
        &["run", "--wait", "--json", "--name", "kept", "--", "true"],
    );
    let pruned = run_id_of(launched[0].to_string().as_bytes());
    let _ = home.cmd().args(["wait", &pruned.to_string()]).output();
    crate::support::reconcile_until_closed(&home.file("journal.redb"), &[pruned], || {
        let _ = home.cmd().arg("reconcile").output();
    });
    // The first run's result consumed, so that it can be pruned and listed as pruned.
    let _ = std::fs::remove_file(home.file(&format!("results/{pruned}.json")));
    // A queue that admits nothing: a run launched into it waits.
    let mut documents = vec![launched, ended];
    documents.push(json_of(
        &home,
        &["queue", "q", "--max-active", "0", "--json"],
    ));
    documents.push(json_of(
        &home,
        &["run", "--queue", "q", "--json", "--", "true"],
    ));
    assert_eq!(
        documents[3][0]["state"], "queued",
        "a run in a queue that admits nothing waits: {:?}",
        documents[3]
    );
    for args in [
        &["retention", "--json"][..],
        &["prune", "--keep-runs", "1", "--dry-run", "--json"],
        &["prune", "--keep-runs", "1", "--json"],
        &["list", "--all", "--json"],
        &["reconcile", "--json"],
        &["status", &pruned.to_string(), "--json"],
    ] {
        documents.push(json_of(&home, args));
    }
    let listed = &documents[7];
    assert!(
        listed
            .iter()
            .any(|entry| entry["pruned"] == Value::Bool(true)),
        "a pruned run is listed: {listed:?}"
    );
    // A run with a hook that fails, and the home's hook.
    let hooked = run_id_of(
        json_of(
            &home,
            &["run", "--json", "--on-exit", "exit 1", "--", "true"],
        )[0]
        .to_string()
        .as_bytes(),
    );
    let set = home
        .cmd()
        .args(["hook", "set", "true"])
        .output()
        .expect("runjournal runs");
    assert!(set.status.success(), "{set:?}");
    for args in [
        &["hooks", &hooked.to_string(), "--json"][..],
        &["hooks", "--json"],
        &["hook", "show", "--json"],
    ] {
        let document = json_of(&home, args);
        assert!(!document.is_empty(), "{args:?}");
        documents.push(document);
    }
    // What `status` adds beside pi-subagents' document: the kept environment, its variables
    // shown, and the hooks.
    let status = json_of(
        &home,
        &["status", &hooked.to_string(), "--show-env", "--json"],
    );
    let status = status.first().expect("one document");
    assert!(
        status["environment"]["values"].is_array(),
        "the variables are shown: {status}"
    );
    documents.push(vec![status["environment"].clone(), status["hooks"].clone()]);
    for document in documents.iter().flatten() {
        assert_eq!(
            runjournal::json::keys_off_convention(document),
            Vec::<String>::new(),
            "{document}"
        );
    }
}
