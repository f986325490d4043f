//! The deployment files validate offline: docker-compose.yml against the
//! Compose specification, every Kubernetes manifest against Kubernetes'
//! schemas (strict: unknown fields fail), and the KEDA ScaledObject against
//! deploy/kubernetes/schemas/. A typo'd copy of each fails, so the checks bite.
//! No shipped file holds a gateway key the gateway would take.

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
        "deploy/kubernetes/deployment-transcribe.yaml",
        "deploy/kubernetes/deployment-gpu.yaml",
        "deploy/kubernetes/gateway.yaml",
    ];
    let (ok, out) = run(&validate, &[&["--strict"][..], &manifests[..]].concat());
    assert!(ok, "{out}");
    assert_eq!(out.matches("passed for resource").count(), 12, "{out}");
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
            "deploy/kubernetes/scaledobject-transcribe.yaml",
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
    let text: String = [
        "scaledobject.yaml",
        "scaledobject-generate.yaml",
        "scaledobject-transcribe.yaml",
    ]
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
        let deployment = [
            "deployment.yaml",
            "deployment-generate.yaml",
            "deployment-transcribe.yaml",
        ]
        .iter()
        .map(|f| std::fs::read_to_string(repo_root().join("deploy/kubernetes").join(f)).unwrap())
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

/// deploy/nats/cluster.conf as shipped, moved to loopback (ports, routes,
/// names, certificates; its permissions left out): three nodes form one
/// JetStream cluster over mutual-TLS routes, clients connect over TLS, and
/// every node fsyncs before it acknowledges a write (`sync_interval:
/// always`, issue #39), as its `/jsz` reports. A fourth server that can
/// reach the route port but holds no certificate of the cluster's CA is
/// refused (the shipped file's routes had no auth and no TLS: any such
/// server joined, JetStream and all).
#[tokio::test]
async fn the_production_cluster_file_forms_a_cluster_that_syncs_before_it_acks() {
    let shipped = std::fs::read_to_string(repo_root().join("deploy/nats/cluster.conf")).unwrap();
    assert!(
        shipped.contains("\n  sync_interval: always\n"),
        "cluster.conf must fsync before it acks"
    );
    let tls = tempfile::tempdir().unwrap();
    crate::auth::make_certificates(tls.path());
    // One certificate, for 127.0.0.1, serves the clients and the routes here.
    std::fs::copy(tls.path().join("server.pem"), tls.path().join("route.pem")).unwrap();
    std::fs::copy(
        tls.path().join("server-key.pem"),
        tls.path().join("route-key.pem"),
    )
    .unwrap();
    let ports: Vec<u16> = (0..3).map(|_| sluice_tests::free_port()).collect();
    let mut starts = Vec::new();
    for i in 0..3 {
        let mut text = shipped
            .replace("server_name: nats-0", &format!("server_name: nats-{i}"))
            .replace("listen: 0.0.0.0:4222", "listen: 127.0.0.1:-1")
            .replace("http: 0.0.0.0:8222", "http: 127.0.0.1:-1")
            .replace(
                "listen: 0.0.0.0:6222",
                &format!("listen: 127.0.0.1:{}", ports[i]),
            )
            .replace("include ./permissions.conf", "")
            .replace("/etc/nats/tls/", &format!("{}/", tls.path().display()))
            // The harness gives each node its own store (-sd).
            .replace("store_dir: /data/jetstream", "");
        for (j, port) in ports.iter().enumerate() {
            text = text.replace(
                &format!("nats-route://nats-{j}:6222"),
                &format!("nats-route://127.0.0.1:{port}"),
            );
        }
        assert!(!text.contains("0.0.0.0"), "not all on loopback:\n{text}");
        starts.push(async move { sluice_tests::NatsServer::start_with_config(Some(&text)).await });
    }
    let nodes = futures::future::try_join_all(starts).await.unwrap();
    for node in &nodes {
        assert!(
            node.syncs_always().await.unwrap(),
            "node {} does not sync always",
            node.port
        );
    }
    // Clients speak TLS: trusting the cluster's CA, they get in.
    let client = async_nats::ConnectOptions::new()
        .add_root_certificates(tls.path().join("ca.pem"))
        .require_tls(true)
        .connect(nodes[0].url())
        .await
        .unwrap();
    // One cluster: a stream with three replicas can be made on it.
    let js = async_nats::jetstream::new(client);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let made = js
            .create_stream(async_nats::jetstream::stream::Config {
                name: "R3".into(),
                subjects: vec!["r3.>".into()],
                num_replicas: 3,
                ..Default::default()
            })
            .await;
        match made {
            Ok(_) => break,
            Err(e) => {
                assert!(std::time::Instant::now() < until, "no R3 stream: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            }
        }
    }
    let ack = js
        .publish("r3.x", "job".into())
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(ack.sequence, 1);

    // The attack: a server of the same cluster name, routed to every node,
    // without the CA's certificate.
    let routes: Vec<String> = ports
        .iter()
        .map(|p| format!("nats-route://127.0.0.1:{p}"))
        .collect();
    let rogue = sluice_tests::NatsServer::start_with_config(Some(&format!(
        "server_name: rogue\ncluster {{\n  name: sluice\n  listen: 127.0.0.1:{}\n  routes: [{}]\n}}\n",
        sluice_tests::free_port(),
        routes.join(", ")
    )))
    .await
    .unwrap();
    let routez = format!("{}/routez", rogue.monitor_url());
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::time::Instant::now() < until {
        let routes: serde_json::Value =
            serde_json::from_str(&sluice_tests::get_text(&routez).await).unwrap();
        assert_eq!(
            routes["num_routes"], 0,
            "a server without the cluster's certificate joined it: {routes}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// The compose file served `local:sk-local-change-me` on every interface and
/// the Kubernetes manifest shipped `team-a:change-me-team-a-key` in a
/// Secret: keys anyone who read the repository could use. Every
/// `SLUICE_GATEWAY_KEYS` a shipped file sets is now either a variable the
/// operator must set or a placeholder the gateway refuses.
#[test]
fn no_shipped_file_holds_a_gateway_key_the_gateway_would_take() {
    let root = repo_root();
    let mut seen = 0;
    for file in [
        "docker-compose.yml",
        "deploy/kubernetes/gateway.yaml",
        "deploy/kubernetes/secret.example.yaml",
    ] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        for line in text.lines() {
            let Some((_, value)) = line.split_once("SLUICE_GATEWAY_KEYS:") else {
                continue;
            };
            seen += 1;
            let value = value.trim().trim_matches('"');
            if value.starts_with("${") {
                assert!(value.contains(":?"), "{file}: {value} has a default");
                continue;
            }
            let loaded =
                sluice_gateway::auth::Keys::load(None, Some(&sluice_schemas::Secret::new(value)));
            let refused = loaded.map(|_| ()).unwrap_err();
            assert!(
                format!("{refused:#}").contains("is a placeholder"),
                "{file}: {value}: {refused:#}"
            );
        }
    }
    assert_eq!(seen, 2, "the files set SLUICE_GATEWAY_KEYS twice");
}

/// deploy/nats/permissions.conf shipped `password: "change-me"` for every
/// role, admin (full JetStream access) among them: a server run with the
/// file as shipped let in anyone who had read the repository. No password
/// is written in it now (each is read from the server's environment), and
/// a server started without them refuses to run rather than run open.
#[test]
fn the_shipped_nats_permissions_let_no_one_in_with_a_password_from_the_repository() {
    let shipped =
        std::fs::read_to_string(repo_root().join("deploy/nats/permissions.conf")).unwrap();
    let mut users = 0;
    for line in shipped.lines().filter(|l| !l.trim_start().starts_with('#')) {
        let Some((_, value)) = line.split_once("password:") else {
            continue;
        };
        users += 1;
        assert!(
            value.trim().starts_with("$SLUICE_NATS_"),
            "a password written in the file: {line}"
        );
    }
    assert_eq!(users, 4, "publisher, consumer, gateway and admin");

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("server.conf");
    std::fs::write(&config, format!("listen: 127.0.0.1:-1\n{shipped}")).unwrap();
    let mut server = std::process::Command::new(sluice_tests::bin_dir().join("nats-server"));
    server
        .arg("-c")
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    for role in ["PUBLISHER", "CONSUMER", "GATEWAY", "ADMIN"] {
        server.env_remove(sluice_tests::role_password_variable(role));
    }
    let mut child = server.spawn().unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > until {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("nats-server runs with the shipped permissions and no role's password set");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("SLUICE_NATS_") && stderr.contains("can not be found"),
        "the refusal names the unset variable: {stderr}"
    );
}

/// The compose file shipped S3 credentials anyone who read the repository
/// could use (`sluice-secret-key-change-me`, one identity for every
/// process, full access) and a NATS server with no auth at all. Now no
/// shipped file holds an S3 secret or a NATS password: the identities are
/// rendered from a template that is not JSON until its secrets are filled
/// in (a server pointed at it refuses to start), the renderer refuses an
/// unset or placeholder secret naming its variable, and compose refuses to
/// start until every role's secret is set.
#[test]
fn no_shipped_file_holds_an_s3_secret_or_a_nats_password_and_compose_runs_each_role_as_itself() {
    let root = repo_root();
    let template =
        std::fs::read_to_string(root.join("deploy/s3/identities.json.template")).unwrap();
    assert!(
        serde_json::from_str::<serde_json::Value>(&template).is_err(),
        "the template parses as JSON: a server could run it with its placeholders as secrets"
    );
    let render = |secret: &str| {
        let mut cmd = Command::new(root.join("deploy/s3/render-identities"));
        cmd.env("SLUICE_BUCKET", "sluice");
        for role in ["PUBLISHER", "CONSUMER", "GATEWAY", "ADMIN"] {
            cmd.env(format!("SLUICE_S3_{role}_SECRET_KEY"), secret);
        }
        cmd.env_remove("SLUICE_S3_ADMIN_SECRET_KEY");
        cmd.output().unwrap()
    };
    for refused in ["", "change-me", "has spaces in it and is long"] {
        let out = render(refused);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{refused:?} was taken");
        assert!(
            stderr.contains("SLUICE_S3_") && stderr.contains("must be set"),
            "the refusal names the variable: {stderr}"
        );
    }
    let identities = sluice_tests::shipped_s3_identities("sluice").unwrap();
    let identities = identities["identities"].as_array().unwrap();
    let mut roles = Vec::new();
    for identity in identities {
        let name = identity["name"].as_str().unwrap();
        let actions: Vec<&str> = identity["actions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        if name == "sluice-admin" {
            continue;
        }
        roles.push(name);
        assert!(
            actions
                .iter()
                .all(|a| a.contains(":sluice/") && a.ends_with("/*")),
            "{name} reaches past its own keys: {actions:?}"
        );
    }
    assert_eq!(
        roles,
        ["sluice-publisher", "sluice-consumer", "sluice-gateway"]
    );

    // Compose: each secret a variable it refuses to start without, each
    // process with its own role's identity, NATS with the permissions.
    let compose = std::fs::read_to_string(root.join("docker-compose.yml")).unwrap();
    for line in compose.lines().filter(|l| !l.trim_start().starts_with('#')) {
        for key in [
            "AWS_SECRET_ACCESS_KEY:",
            "NATS_PASSWORD:",
            "_SECRET_KEY:",
            "_PASSWORD:",
        ] {
            if let Some((_, value)) = line.split_once(key) {
                assert!(
                    value.trim().starts_with("${SLUICE_"),
                    "a secret written in docker-compose.yml: {line}"
                );
            }
        }
    }
    for (service, user, s3) in [
        ("init", "admin", "sluice-admin"),
        ("consumer", "consumer", "sluice-consumer"),
        ("gateway", "gateway", "sluice-gateway"),
    ] {
        let block = compose
            .split(&format!("\n  {service}:\n"))
            .nth(1)
            .and_then(|rest| rest.split("\n\n").next())
            .unwrap_or_else(|| panic!("no {service} service"));
        assert!(
            block.contains(&format!("NATS_USER: {user}\n"))
                && block.contains(&format!("AWS_ACCESS_KEY_ID: {s3}\n")),
            "{service} does not run as its role:\n{block}"
        );
    }
    // The compose NATS config (with the shipped permissions beside it, as
    // mounted) parses with every password set and refuses to without.
    let dir = tempfile::tempdir().unwrap();
    for (from, to) in [
        ("deploy/compose/nats.conf", "compose.conf"),
        ("deploy/nats/permissions.conf", "permissions.conf"),
    ] {
        std::fs::copy(root.join(from), dir.path().join(to)).unwrap();
    }
    let check = |set: bool| {
        let mut cmd = Command::new(sluice_tests::bin_dir().join("nats-server"));
        cmd.arg("-t").arg("-c").arg(dir.path().join("compose.conf"));
        for role in ["PUBLISHER", "CONSUMER", "GATEWAY", "ADMIN"] {
            let variable = sluice_tests::role_password_variable(role);
            if set {
                cmd.env(variable, "a-password");
            } else {
                cmd.env_remove(variable);
            }
        }
        cmd.output().unwrap()
    };
    let out = check(true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!check(false).status.success());
}
