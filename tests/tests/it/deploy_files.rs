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
        "deploy/kubernetes/deployment-generate.yaml",
        "deploy/kubernetes/deployment-gpu.yaml",
        "deploy/kubernetes/gateway.yaml",
    ];
    let (ok, out) = run(&validate, &[&["--strict"][..], &manifests[..]].concat());
    assert!(ok, "{out}");
    assert_eq!(out.matches("passed for resource").count(), 10, "{out}");
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
            "deploy/kubernetes/scaledobject-generate.yaml",
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

/// The settings `sluice init` gets in Kubernetes (init-job.yaml's ConfigMap).
fn init_job_settings() -> sluice_producer::provision::Settings {
    let text =
        std::fs::read_to_string(repo_root().join("deploy/kubernetes/init-job.yaml")).unwrap();
    let (_, block) = text.split_once("sluice.toml: |\n").unwrap();
    let toml: String = block
        .lines()
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l)))
        .collect();
    sluice_producer::provision::Settings::from_toml(&toml).unwrap()
}

/// Each ScaledObject of scaledobject*.yaml: (its target, the durables its
/// triggers read).
fn scaled_objects() -> Vec<(String, Vec<String>)> {
    let text: String = ["scaledobject.yaml", "scaledobject-generate.yaml"]
        .iter()
        .map(|f| std::fs::read_to_string(repo_root().join("deploy/kubernetes").join(f)).unwrap())
        .collect();
    text.split("kind: ScaledObject")
        .skip(1)
        .map(|doc| {
            let (_, target) = doc.split_once("scaleTargetRef:").unwrap();
            let target = target.split_once("name:").unwrap().1;
            let target = target.lines().next().unwrap().trim().to_string();
            let consumers = doc
                .lines()
                .filter_map(|l| l.trim().strip_prefix("consumer: "))
                .map(|c| c.trim_matches('"').to_string())
                .collect();
            (target, consumers)
        })
        .collect()
}

#[test]
fn every_deployed_model_scales_on_its_own_durables() {
    use sluice_schemas::{Priority, Task, Topology};
    let models = init_job_settings().deployed_models();
    assert!(models.len() >= 2, "{models:?}");
    let objects = scaled_objects();
    assert_eq!(objects.len(), models.len(), "{objects:?}");
    let t = Topology::default();
    for m in &models {
        let task = Task::parse(&m.task).unwrap();
        let want: Vec<String> = Priority::ALL
            .iter()
            .map(|&p| t.model_consumer(task, m.route().as_deref(), p, None))
            .collect();
        let (target, mut have) = objects
            .iter()
            .find(|(_, c)| c.contains(&want[0]))
            .cloned()
            .unwrap_or_else(|| panic!("no ScaledObject reads {want:?}: {objects:?}"));
        have.sort();
        let mut want = want;
        want.sort();
        assert_eq!(have, want, "{} scales on the wrong durables", m.key());
        // Its target runs the model's task and model.
        let deployment = ["deployment.yaml", "deployment-generate.yaml"]
            .iter()
            .map(|f| {
                std::fs::read_to_string(repo_root().join("deploy/kubernetes").join(f)).unwrap()
            })
            .find(|d| d.contains(&format!("  name: {target}\n")))
            .unwrap_or_else(|| panic!("no Deployment {target}"));
        let env = |name: &str| {
            deployment
                .lines()
                .find(|l| l.contains(&format!("name: {name},")))
                .and_then(|l| l.split("value: ").nth(1))
                .map(|v| v.trim_end_matches([' ', '}']).trim_matches('"').to_string())
        };
        assert_eq!(
            env("SLUICE_TASK").unwrap_or("embed".into()),
            m.task,
            "{target}"
        );
        assert_eq!(
            env("SLUICE_MODEL_NAME").unwrap_or(task.default_model().into()),
            m.model,
            "{target}"
        );
    }
}
