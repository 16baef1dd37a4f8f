//! `xtask complexity` on the real tree: the table, `--json` and `--plot`.

use std::process::Command;

#[test]
fn complexity_runs_on_the_workspace_and_writes_json_and_svg() {
    let dir = std::env::temp_dir().join(format!("xtask-complexity-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (json, svg) = (dir.join("complexity.json"), dir.join("complexity.svg"));
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["complexity", "--top", "3", "--json"])
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    for mode in ["| copy |", "| pindown |", "| odp |", "| odp-nic |"] {
        assert!(table.contains(mode), "no row {mode} in\n{table}");
    }
    assert!(table.contains("most cognitively complex functions"));

    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    for r in rows {
        assert!(r["functions"].as_u64().unwrap() > 0);
        assert!(r["lines"]["sloc"].as_f64().unwrap() > 0.0);
        assert!(r["top_functions"].as_array().unwrap().len() <= 3);
    }
    assert!(!v["file_sets"].as_array().unwrap().is_empty());

    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(chart.starts_with("<svg"));
    assert!(chart.contains("pindown") && chart.contains("cognitive complexity"));
    std::fs::remove_dir_all(&dir).unwrap();
}
