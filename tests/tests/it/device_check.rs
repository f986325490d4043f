//! The GPU machine's one-shot check, dry-run on the CPU: `scripts/device-bundle
//! --cpu` makes the same bundle a CUDA build would (under the 64 MiB a device
//! machine is sent), and the bundle's own `device-check` runs it with no
//! checkout beside it. A bundle whose reference is wrong fails the check.

use std::path::Path;
use std::process::{Command, Output};

use sluice_tests::deploy::consumer_binary;
use sluice_tests::repo_root;

const LIMIT: u64 = 64 << 20;

fn make_bundle(out: &Path) {
    let made = Command::new(repo_root().join("scripts/device-bundle"))
        .arg("--cpu")
        .arg(out)
        .env("SLUICE_CONSUMER_BIN", consumer_binary().unwrap())
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "device-bundle failed: {}",
        String::from_utf8_lossy(&made.stderr)
    );
}

fn bundle_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                bundle_bytes(&e.path())
            } else {
                e.metadata().unwrap().len()
            }
        })
        .sum()
}

/// Runs the bundle's own copy of the script, from a folder that is not a
/// checkout, with small counts (the figures are the GPU's business).
fn check(bundle: &Path, extra: &[&str]) -> Output {
    Command::new(bundle.join("device-check"))
        .args(["--texts", "200", "--new-tokens", "4", "--sequences", "1,4"])
        .args(extra)
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap()
}

#[test]
fn the_device_bundle_fits_and_its_check_passes_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    make_bundle(&bundle);
    let bytes = bundle_bytes(&bundle);
    assert!(bytes <= LIMIT, "the bundle holds {bytes} bytes");

    let json = dir.path().join("report.json");
    let out = check(&bundle, &["--json", json.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for row in [
        "| embed: start-up budget vs free memory after loading |",
        "| embed: 22 reference texts vs sentence-transformers",
        "| embed: 200 texts,",
        "| generate: decode, 1 sequence(s) x 4 tokens",
        "| generate: decode, 4 sequence(s) x 4 tokens",
        "| generate: peak host RSS above the loaded model |",
    ] {
        assert!(stdout.contains(row), "no row {row:?} in\n{stdout}");
    }
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["device"], "cpu");
    let rows = report["rows"].as_array().unwrap();
    assert!(rows.iter().all(|r| r["pass"] != false), "{report}");
    assert_eq!(rows.iter().filter(|r| r["pass"] == true).count(), 3);
}

#[test]
fn a_bundle_whose_reference_is_wrong_fails_the_check_and_says_which_row() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    make_bundle(&bundle);
    // Negate every reference vector: the embeddings no longer match.
    let path = bundle.join("minilm_reference.json");
    let mut reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for item in reference["items"].as_array_mut().unwrap() {
        for x in item["embedding"].as_array_mut().unwrap() {
            *x = serde_json::json!(-x.as_f64().unwrap());
        }
    }
    std::fs::write(&path, reference.to_string()).unwrap();
    let out = check(&bundle, &[]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(!out.status.success(), "{stdout}");
    let row = stdout
        .lines()
        .find(|l| l.contains("reference texts vs sentence-transformers"))
        .unwrap_or_else(|| panic!("no cosine row in\n{stdout}"));
    // Negated references: the cosine is about -1 (exactly -1.00000 where
    // the forward runs f32, as `--embed-weights auto` picks on some CPUs).
    let cosine: f64 = row
        .split("min cosine ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no cosine in {row}"));
    assert!(cosine <= -0.99 && row.ends_with("FAILED |"), "{row}");
    assert!(stderr.contains("a check failed"), "{stderr}");

    // Not a bundle at all: said plainly.
    let out = Command::new(repo_root().join("scripts/device-check"))
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not a bundle"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
