//! The book's chapter on the collective model, replayed: every `$ rocev2
//! entropy` command of its `console` blocks, run as written, prints the
//! lines under it (alignment aside; `…` stands for lines the book leaves
//! out). The model is deterministic, so the numbers are compared as they
//! are: a change to the model that moves them changes the book too. No
//! root and no namespace: the model runs offline.

use std::process::Command;

use rocev2_tests::{
    book::{self, assert_shows, squeeze},
    rocev2_bin,
};
use rocev2_user::testbed::lab::fabric::collective::BUSY_ELSEWHERE;

#[test]
fn the_books_collective_model_chapter_prints_what_the_book_shows() {
    let steps = book::console_steps("collective-model.md");
    assert_eq!(steps.len(), 4, "the lab-scale scorecard and three paper-scale modes");
    for book::Step { command, expected } in &steps {
        let args: Vec<&str> = command.split_whitespace().collect();
        assert_eq!(args[..2], ["rocev2", "entropy"], "{command}");
        let out = Command::new(rocev2_bin()).args(&args[1..]).output().unwrap();
        assert!(out.status.success(), "{command}: {}", String::from_utf8_lossy(&out.stderr));
        assert_shows(command, expected, &String::from_utf8_lossy(&out.stdout), squeeze);
    }
}

/// A row of the book's comparison table: (row, lab %, model %, lab/model,
/// shown in bold as a disagreement). Rows the model does not predict show
/// its figure and the ratio in parentheses.
fn comparison_rows(text: &str) -> Vec<(String, String, String, String, bool)> {
    let start = text.find("| row | lab, of ideal |").expect("the chapter has its comparison table");
    text[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            let bold = cells[3].starts_with("**");
            let ratio = cells[3].trim_matches('*').to_string();
            (cells[0].to_string(), cells[1].to_string(), cells[2].to_string(), ratio, bold)
        })
        .collect()
}

#[test]
fn the_books_model_comparison_is_the_labs_run_and_the_models_prediction() {
    // The lab's run, as the collectives chapter renders it.
    let lab: serde_json::Value = serde_json::from_str(&book::chapter("scorecard.json")).unwrap();
    assert!(
        lab["fabric"].as_str().unwrap().starts_with("4 racks x 4 hosts, 4 spines, links 10mbit,"),
        "{}",
        lab["fabric"]
    );
    assert_eq!((lab["size"].as_u64(), lab["chunk"].as_u64()), (Some(4 << 20), Some(32 << 10)));
    // The model on that fabric: the chapter's first command, as JSON.
    let text = book::chapter("collective-model.md");
    let command =
        text.lines().find_map(|l| l.strip_prefix("$ rocev2 entropy --racks 4 ")).expect("the lab-scale command");
    let args: Vec<String> =
        format!("entropy --racks 4 {command} --json").split_whitespace().map(String::from).collect();
    let out = Command::new(rocev2_bin()).args(&args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let model: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let table = comparison_rows(&text);
    let lab_rows = lab["modes"].as_array().unwrap();
    assert_eq!(table.len(), lab_rows.len(), "a table row per lab row");
    let mut predicted_rows = 0;
    for (row, shown) in lab_rows.iter().zip(&table) {
        let (mode, qps) = (row["mode"].as_str().unwrap(), row["qps"].as_u64().unwrap());
        let predicted = model["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["row"] == mode && r["prediction"]["qps"].as_u64() == Some(qps))
            .unwrap_or_else(|| panic!("the model has no row {mode} x{qps}"));
        let (lab_share, model_share) =
            (row["share_of_ideal"].as_f64().unwrap(), predicted["prediction"]["share_of_ideal"].as_f64().unwrap());
        // Flowlet and transport-aware rows: the model's figure, not a prediction.
        let predicts = row["model_predicts"].as_bool().unwrap();
        assert_eq!(predicts, !(mode.starts_with("flowlet") || mode.starts_with("transport-aware")), "{mode}");
        let ratio = lab_share / model_share;
        let model_text = match format!("{:.1}%", model_share * 100.0) {
            t if t == "100.0%" => "100%".to_string(),
            t => t,
        };
        let expected = match predicts {
            true => (
                format!("{mode} x{qps}"),
                format!("{:.1}%", lab_share * 100.0),
                model_text,
                format!("{ratio:.2}"),
                (ratio - 1.0).abs() > 0.15,
            ),
            false => (
                format!("{mode} x{qps}"),
                format!("{:.1}%", lab_share * 100.0),
                format!("({model_text})"),
                format!("({ratio:.2})"),
                false,
            ),
        };
        assert_eq!(*shown, expected, "the book's row for {mode} x{qps} (bold: more than 15% apart)");
        // What the chapter claims: every row the model predicts (paths fixed
        // for the run: hashing, slices, TE) agrees with the lab within 15%;
        // slices and TE, which keep every host at its link rate, ran while
        // other processes used almost none of the machine's CPUs.
        if predicts {
            predicted_rows += 1;
            assert!((ratio - 1.0).abs() <= 0.15, "{mode} x{qps}: lab {lab_share:.3}, model {model_share:.3}");
            let elsewhere = row["busy_elsewhere"].as_f64().unwrap();
            if mode == "slice" || mode == "te" {
                assert!(elsewhere <= BUSY_ELSEWHERE, "{mode}: other processes used {elsewhere:.2} of the CPUs");
            }
        }
    }
    assert_eq!(predicted_rows, 7, "five-tuple, qp x1/2/4/8, slice, te");
}
