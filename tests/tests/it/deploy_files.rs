//! The deployment files validate offline: docker-compose.yml against the
//! Compose specification, every Kubernetes manifest against Kubernetes'
//! schemas (strict: unknown fields fail), and the KEDA ScaledObject against
//! deploy/kubernetes/schemas/. A typo'd copy of each fails, so the checks bite.

use std::path::{Path, PathBuf};
use std::process::Command;

use sluice_tests::repo_root;

fn tool(name: &str) -> PathBuf {
    let path = repo_root().join(".sluice/pyenv/bin").join(name);
    assert!(
        path.is_file(),
        "{} not found: run ./scripts/setup",
        path.display()
    );
    path
}

/// Runs a validator; returns (success, its output).
fn run(program: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(program)
        .args(args)
        .current_dir(repo_root())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success() && !text.contains("ERROR"), text)
}

fn typo_copy(dir: &Path, file: &str, from: &str, to: &str) -> String {
    let text = std::fs::read_to_string(repo_root().join(file)).unwrap();
    assert!(text.contains(from), "{file} lacks {from:?}");
    let path = dir.join(Path::new(file).file_name().unwrap());
    std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn compose_file_follows_the_compose_specification() {
    let check = tool("check-jsonschema");
    let args = ["--builtin-schema", "vendor.compose-spec"];
    let (ok, out) = run(&check, &[&args[..], &["docker-compose.yml"]].concat());
    assert!(ok, "{out}");
    let dir = tempfile::tempdir().unwrap();
    let bad = typo_copy(
        dir.path(),
        "docker-compose.yml",
        "depends_on:",
        "depend_on:",
    );
    let (ok, out) = run(&check, &[&args[..], &[bad.as_str()]].concat());
    assert!(!ok, "a typo passed: {out}");
}

#[test]
fn kubernetes_manifests_validate_strictly() {
    let validate = tool("kubernetes-validate");
    let manifests = [
        "deploy/kubernetes/configmap.yaml",
        "deploy/kubernetes/secret.example.yaml",
        "deploy/kubernetes/init-job.yaml",
        "deploy/kubernetes/deployment.yaml",
        "deploy/kubernetes/deployment-gpu.yaml",
        "deploy/kubernetes/gateway.yaml",
    ];
    let (ok, out) = run(&validate, &[&["--strict"][..], &manifests[..]].concat());
    assert!(ok, "{out}");
    assert_eq!(out.matches("passed for resource").count(), 9, "{out}");
    let dir = tempfile::tempdir().unwrap();
    let bad = typo_copy(
        dir.path(),
        "deploy/kubernetes/deployment.yaml",
        "readinessProbe:",
        "readynessProbe:",
    );
    let (ok, out) = run(&validate, &["--strict", &bad]);
    assert!(!ok, "a typo passed: {out}");
}

#[test]
fn keda_scaled_object_validates_against_its_schema() {
    let check = tool("check-jsonschema");
    let schema = "deploy/kubernetes/schemas/keda-scaledobject.schema.json";
    let (ok, out) = run(
        &check,
        &[
            "--schemafile",
            schema,
            "deploy/kubernetes/scaledobject.yaml",
        ],
    );
    assert!(ok, "{out}");
    let dir = tempfile::tempdir().unwrap();
    let bad = typo_copy(
        dir.path(),
        "deploy/kubernetes/scaledobject.yaml",
        "lagThreshold: \"100\"",
        "lagTreshold: \"100\"",
    );
    let (ok, out) = run(&check, &["--schemafile", schema, &bad]);
    assert!(!ok, "a typo passed: {out}");
}
